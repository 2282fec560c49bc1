"""Text-only label work shared by the store, the SLM layer and the evaluation.

Nothing here reads a store: functions take texts, phrases, vectors and centres and return
phrases, labels and numbers, so every layer above can use them.

  keyphrases  keyphrase extraction and ranking, topic phrases, the re-rank by distinctness, labels made of them
  wordclass   which words name a topic: English word frequency (wordfreq) and parts of speech (lemminflect)
  profiles    vector profiles of a few texts; the word lists an SLM's tags are cleaned with
  measures    label measures: copy rate, groundedness, self@1, generic labels, self_misses
"""
