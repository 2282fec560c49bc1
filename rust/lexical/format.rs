//! The file `index/lexical.bin`: the whole index with the rows it covers (the watermark).
//!
//! Layout (little endian), framed as every checksummed file of the crate (`bytes::Format`):
//! ```text
//! magic "CLAGLEX\0" | version u32 | rows u64 | namespaces u64 | terms u64 | postings u64
//! | forward u64 | docs u64 | tokens u64 | ns_df entries u64
//! | per namespace: len u32, utf-8 | ns_docs u64 x ns | ns_tokens u64 x ns
//! | per term: len u32, utf-8 | max_tf u16 x terms | min_len u32 x terms | df_all u32 x terms
//! | postings per term u64 x terms | posting rows u32 x postings | tf u16 x postings
//! | doc_len u32 x rows | doc_ns u32 x rows | counted u8 x rows
//! | fwd_off u64 x (rows + 1) | fwd u32 x forward | ns_df (key u64, count u32) x entries
//! | checksum u64 of everything before it
//! ```
//! The statistics are stored rather than recounted so a load is a parse, not a pass over the
//! postings with hash updates (a 1M-memory index loads in a fraction of a second).

use std::path::Path;

use super::hash::FxMap;
use super::{Lexical, Postings, NO_DOC};
use crate::bytes::{self, Format, Reader};
use crate::error::{Error, Result};
use crate::files;

/// The file format. Version 2: tokens are stemmed (`stem_ascii`); a version-1 file is
/// refused and the store rebuilds the index from the database.
pub const FORMAT: Format = Format { magic: *b"CLAGLEX\0", what: "lexical index", versions: &[(2, bytes::checksum)] };

fn corrupt(why: &str) -> Error {
    bytes::corrupt(FORMAT.what, why)
}

/// Every term's postings: their lengths, then every row, then every tf; rows ascending within
/// a term and below `rows`.
fn read_postings(r: &mut Reader, n_terms: u64, n_post: u64, rows: u64) -> Result<Vec<Postings>> {
    let lens = r.vec::<u64>(n_terms)?;
    if lens.iter().try_fold(0u64, |a, &l| a.checked_add(l)) != Some(n_post) {
        return Err(corrupt("postings count"));
    }
    let all_rows = r.vec::<u32>(n_post)?;
    let all_tf = r.vec::<u16>(n_post)?;
    let mut postings = Vec::with_capacity(lens.len());
    let mut at = 0usize;
    for &l in &lens {
        let (rs, ts) = (&all_rows[at..at + l as usize], &all_tf[at..at + l as usize]);
        at += l as usize;
        if rs.windows(2).any(|w| w[0] >= w[1]) || rs.last().is_some_and(|&x| x as u64 >= rows) {
            return Err(corrupt("posting rows out of order or past the rows covered"));
        }
        postings.push(Postings { rows: rs.to_vec(), tf: ts.to_vec() });
    }
    Ok(postings)
}

/// The (namespace << 32 | term) -> documents map from its `n` 12-byte entries.
fn read_ns_df(r: &mut Reader, n: u64, n_ns: u64, n_terms: u64) -> Result<FxMap<u64, u32>> {
    let entries = r.items(n, 12)?;
    let mut ns_df = FxMap::default();
    ns_df.reserve(n as usize);
    for c in entries.chunks_exact(12) {
        let k = u64::from_le_bytes(c[..8].try_into().unwrap());
        if k >> 32 >= n_ns || (k & 0xFFFF_FFFF) >= n_terms {
            return Err(corrupt("namespace statistics"));
        }
        ns_df.insert(k, u32::from_le_bytes(c[8..].try_into().unwrap()));
    }
    Ok(ns_df)
}

impl Lexical {
    /// The file image (layout above).
    pub fn encode(&self) -> Vec<u8> {
        let rows = self.doc_len.len();
        let words: usize = self.words.iter().map(|w| w.len() + 4).sum();
        let mut w = FORMAT.writer(128 + words + self.n_postings * 6 + rows * 17 + self.fwd.len() * 4
            + self.postings.len() * 18 + self.ns_df.len() * 12);
        let mut ns_df: Vec<(u64, u32)> = self.ns_df.iter().map(|(&k, &v)| (k, v)).collect();
        ns_df.sort_unstable();
        w.put_slice(&[rows as u64, self.ns_names.len() as u64, self.words.len() as u64, self.n_postings as u64,
                      self.fwd.len() as u64, self.docs, self.tokens, ns_df.len() as u64]);
        w.put_strings(&self.ns_names);
        w.put_slice(&self.ns_docs);
        w.put_slice(&self.ns_tokens);
        w.put_strings(&self.words);
        w.put_slice(&self.max_tf);
        w.put_slice(&self.min_len);
        w.put_slice(&self.df_all);
        for p in &self.postings {
            w.put(p.rows.len() as u64);
        }
        for p in &self.postings {
            w.put_slice(&p.rows);
        }
        for p in &self.postings {
            w.put_slice(&p.tf);
        }
        w.put_slice(&self.doc_len);
        w.put_slice(&self.doc_ns);
        for &c in &self.counted {
            w.put(c as u8);
        }
        w.put_slice(&self.fwd_off);
        w.put_slice(&self.fwd);
        for (k, v) in ns_df {
            w.put(k);
            w.put(v);
        }
        w.finish()
    }

    /// Parse a file image; every count, row, term and namespace is checked, so a damaged file
    /// is an `Io` error, never a panic or a wrong index.
    pub fn decode(b: &[u8]) -> Result<Lexical> {
        let (_, mut r) = FORMAT.open(b)?;
        let h = r.vec::<u64>(8)?;
        let (rows, n_ns, n_terms, n_post, n_fwd, docs, tokens, n_nsdf) = (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
        if rows >= u32::MAX as u64 || n_ns >= NO_DOC as u64 || n_terms > u32::MAX as u64 {
            return Err(corrupt("sizes"));
        }
        let ns_names = r.strings(n_ns)?;
        let ns_docs = r.vec::<u64>(n_ns)?;
        let ns_tokens = r.vec::<u64>(n_ns)?;
        let words = r.strings(n_terms)?;
        let max_tf = r.vec::<u16>(n_terms)?;
        let min_len = r.vec::<u32>(n_terms)?;
        let df_all = r.vec::<u32>(n_terms)?;
        let postings = read_postings(&mut r, n_terms, n_post, rows)?;
        let doc_len = r.vec::<u32>(rows)?;
        let doc_ns = r.vec::<u32>(rows)?;
        let counted: Vec<bool> = r.items(rows, 1)?.iter().map(|&c| c != 0).collect();
        let fwd_off = r.vec::<u64>(rows + 1)?;
        let fwd = r.vec::<u32>(n_fwd)?;
        let ns_df = read_ns_df(&mut r, n_nsdf, n_ns, n_terms)?;
        r.end()?;
        let mut ix = Lexical { words, postings, max_tf, min_len, df_all, ns_names, ns_docs, ns_tokens, ns_df, docs, tokens,
                               doc_len, doc_ns, counted, fwd_off, fwd, n_postings: n_post as usize, ..Default::default() };
        ix.check_row_tables()?;
        ix.name_maps()?;
        Ok(ix)
    }

    /// The per-row tables agree with the counts: namespaces and terms known, forward lists
    /// covering `fwd` in order, per-namespace sums equal to the totals.
    fn check_row_tables(&self) -> Result<()> {
        let (n_ns, n_terms) = (self.ns_names.len() as u64, self.words.len() as u64);
        if self.doc_ns.iter().any(|&n| n != NO_DOC && n as u64 >= n_ns)
            || self.fwd_off.first() != Some(&0)
            || self.fwd_off.last() != Some(&(self.fwd.len() as u64))
            || self.fwd_off.windows(2).any(|w| w[0] > w[1])
            || self.fwd.iter().any(|&t| t as u64 >= n_terms)
            || self.ns_docs.iter().sum::<u64>() != self.docs
            || self.ns_tokens.iter().sum::<u64>() != self.tokens
        {
            return Err(corrupt("row tables"));
        }
        Ok(())
    }

    /// The word -> term and name -> namespace maps, from the lists; a name listed twice is
    /// corrupt.
    fn name_maps(&mut self) -> Result<()> {
        self.terms.reserve(self.words.len());
        for (i, w) in self.words.iter().enumerate() {
            if self.terms.insert(w.clone(), i as u32).is_some() {
                return Err(corrupt("a word listed twice"));
            }
        }
        for (i, n) in self.ns_names.iter().enumerate() {
            if self.ns_codes.insert(n.clone(), i as u32).is_some() {
                return Err(corrupt("a namespace listed twice"));
            }
        }
        Ok(())
    }

    /// Atomically replace `path` with this index (temp file, fsync, rename, fsync directory):
    /// a crash leaves the old file or the new one.
    pub fn save(&self, path: &Path) -> Result<()> {
        files::write_atomic(path, &self.encode())
    }

    /// Load `path`; errors name the file.
    pub fn load(path: &Path) -> Result<Lexical> {
        files::read_decoded(path, Lexical::decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lexical::{Bm25, Scope};

    #[test]
    fn file_round_trip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lexical.bin");
        let mut ix = Lexical::new();
        ix.add(&[0, 2, 5], &["red apple", "green apple pie", "東京 red"], &["a", "b", "a"]).unwrap();
        ix.sync(&[1, 0, 0, 0, 0, 1]);
        ix.save(&path).unwrap();
        let back = Lexical::load(&path).unwrap();
        assert_eq!(back.encode(), ix.encode());
        assert_eq!(back.len(), 6);
        for q in ["apple", "red", "東", "pie"] {
            for s in [Scope::All, Scope::Namespace("a"), Scope::Namespace("b")] {
                let (x, y) = (ix.score(q, s, None, Bm25::default()), back.score(q, s, None, Bm25::default()));
                assert_eq!((x.rows, x.scores), (y.rows, y.scores));
            }
        }
        let good = std::fs::read(&path).unwrap();
        for at in [0, 9, 20, good.len() / 2, good.len() - 9, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            assert!(Lexical::decode(&bad).is_err(), "flipped byte {at}");
        }
        for len in [0, 7, 40, good.len() / 2, good.len() - 1] {
            assert!(Lexical::decode(&good[..len]).is_err(), "truncated to {len}");
        }
        assert!(Lexical::load(&dir.path().join("missing.bin")).is_err());
    }

    #[test]
    fn a_file_written_before_still_loads() {
        // A version-2 file from the first encoder of this layout; never regenerate it.
        let old: &[u8] = include_bytes!("../testdata/lexical_v2.bin");
        let mut want = Lexical::new();
        want.add(&[0, 2, 5, 6], &["red apple pie", "green apples", "東京 red hiking", "blue sky"], &["a", "b", "a", "b"])
            .unwrap();
        want.sync(&[1, 0, 0, 0, 0, 1, 1]);
        let got = Lexical::decode(old).unwrap();
        assert_eq!(got.encode(), old, "the layout is unchanged: the same index encodes to the same bytes");
        assert_eq!(want.encode(), old);
        assert_eq!((got.len(), got.n_terms(), got.n_postings()), (7, 9, 11));
        assert_eq!(got.stats(Scope::Namespace("a")), (2, 7));
        for q in ["apple", "red hike", "東", "sky blue"] {
            let (x, y) = (want.score(q, Scope::All, None, Bm25::default()), got.score(q, Scope::All, None, Bm25::default()));
            assert_eq!((x.rows, x.scores), (y.rows, y.scores));
        }
        let mut bad = old.to_vec();
        bad[old.len() / 2] ^= 1;
        assert!(Lexical::decode(&bad).is_err());
    }
}
