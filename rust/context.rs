//! Context scores of hybrid search: a candidate's fused score plus shares of its thread
//! neighbours' scores, a question discount, a length prior and a speaker boost (the Python
//! side, `store/context.py`, gathers the candidates and documents the choices).
//!
//! Per query the candidates are a few dozen rows; the per-row columns (neighbours, question
//! flags, word counts, speakers) cover the whole store and are only indexed here.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// The weights of `scores`, as `RankingConfig` holds them.
#[derive(Clone, Debug)]
pub struct Weights {
    /// Share of a neighbour's score per distance in turns (1, 2, ...).
    pub neighbours: Vec<f64>,
    /// A neighbour before the candidate that asks a question passes this many times its share.
    pub question_boost: f64,
    /// A candidate that asks a question keeps this share of its own score.
    pub question_weight: f64,
    pub length_prior: f64,
    pub length_cap: i32,
    pub speaker_boost: f64,
}

/// The per-row columns of the store (one entry per vector row).
pub struct Rows<'a> {
    pub prev: &'a [i64],
    pub next: &'a [i64],
    pub asks: &'a [u8],
    pub words: &'a [i32],
    pub speaker: &'a [i32],
}

/// Final score of each candidate row `cand[i]` whose fused score is `fused[i]`; `named`: the
/// speaker code a query names (-1: none).
pub fn scores(cand: &[i64], fused: &[f32], rows: &Rows, w: &Weights, named: i32) -> Result<Vec<f32>> {
    let n = rows.prev.len();
    if fused.len() != cand.len() {
        return Err(Error::Value(format!("{} scores for {} candidates", fused.len(), cand.len())));
    }
    if rows.next.len() != n || rows.asks.len() != n || rows.words.len() != n || rows.speaker.len() != n {
        return Err(Error::Value("row columns differ in length".into()));
    }
    if let Some(bad) = cand.iter().find(|&&r| r < 0 || r as usize >= n) {
        return Err(Error::Value(format!("candidate row {bad} outside the {n} rows")));
    }
    let at: HashMap<i64, usize> = cand.iter().enumerate().map(|(i, &r)| (r, i)).collect();
    let fused_of = |row: i64| -> f64 { at.get(&row).map_or(0.0, |&i| fused[i] as f64) };
    let asks = |row: i64| rows.asks[row as usize] != 0;
    let out = cand
        .iter()
        .zip(fused)
        .map(|(&row, &f)| {
            let mut s = f as f64 * if asks(row) { w.question_weight } else { 1.0 };
            let (mut back, mut ahead) = (row, row);
            for &share in &w.neighbours {
                back = if back >= 0 { rows.prev[back as usize] } else { -1 };
                ahead = if ahead >= 0 { rows.next[ahead as usize] } else { -1 };
                if back >= 0 {
                    let boost = if asks(back) { w.question_boost } else { 1.0 };
                    s += share * boost * fused_of(back);
                }
                if ahead >= 0 {
                    s += share * fused_of(ahead);
                }
            }
            let words = rows.words[row as usize].clamp(0, w.length_cap);
            s += w.length_prior * (words as f64).ln_1p();
            if named >= 0 && rows.speaker[row as usize] == named {
                s += w.speaker_boost;
            }
            s as f32
        })
        .collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights() -> Weights {
        Weights { neighbours: vec![0.3, 0.1], question_boost: 1.5, question_weight: 0.8, length_prior: 0.0,
                  length_cap: 40, speaker_boost: 0.1 }
    }

    #[test]
    fn neighbours_pass_shares_and_questions_pass_more() {
        // One thread 0 -> 1 -> 2 -> 3; row 1 asks a question.
        let prev = [-1, 0, 1, 2];
        let next = [1, 2, 3, -1];
        let asks = [0u8, 1, 0, 0];
        let words = [1, 1, 1, 1];
        let speaker = [0, 1, 0, 1];
        let rows = Rows { prev: &prev, next: &next, asks: &asks, words: &words, speaker: &speaker };
        let s = scores(&[1, 2, 3], &[1.0, 0.5, 0.0], &rows, &weights(), -1).unwrap();
        // row 1: own 1.0 * 0.8, next (row 2) 0.3 * 0.5, two ahead (row 3) 0.1 * 0
        assert!((s[0] - (0.8 + 0.15) as f32).abs() < 1e-6);
        // row 2: own 0.5, the question before it 0.3 * 1.5 * 1.0, two ahead: none
        assert!((s[1] - (0.5 + 0.45) as f32).abs() < 1e-6);
        // row 3: own 0, before it row 2 0.3 * 0.5, two before (row 1, asks) 0.1 * 1.5 * 1.0
        assert!((s[2] - (0.15 + 0.15) as f32).abs() < 1e-6);
        let named = scores(&[1, 2, 3], &[1.0, 0.5, 0.0], &rows, &weights(), 1).unwrap();
        assert!((named[0] - s[0] - 0.1).abs() < 1e-6 && named[1] == s[1] && (named[2] - s[2] - 0.1).abs() < 1e-6);
    }

    #[test]
    fn the_length_prior_is_capped_and_bad_rows_are_refused() {
        let prev = [-1, -1];
        let next = [-1, -1];
        let asks = [0u8, 0];
        let words = [3, 500];
        let speaker = [-1, -1];
        let rows = Rows { prev: &prev, next: &next, asks: &asks, words: &words, speaker: &speaker };
        let w = Weights { length_prior: 1.0, ..weights() };
        let s = scores(&[0, 1], &[0.0, 0.0], &rows, &w, -1).unwrap();
        assert!((s[0] as f64 - 4f64.ln()).abs() < 1e-6 && (s[1] as f64 - 41f64.ln()).abs() < 1e-5);
        assert!(scores(&[2], &[0.0], &rows, &w, -1).is_err());
        assert!(scores(&[0, 1], &[0.0], &rows, &w, -1).is_err());
    }
}
