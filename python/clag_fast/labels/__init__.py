"""Text-only label work shared by the store, the SLM layer and the evaluation.

Nothing here reads a store: functions take texts, phrases, vectors and centres and return
phrases, labels and numbers, so every layer above can use them.

  keyphrases  keyphrase extraction and ranking, the re-rank by distinctness, labels made of them
  profiles    vector profiles of a few texts; the word lists an SLM's tags are cleaned with
  measures    label measures: copy rate, groundedness, self@1, self_misses
"""
