//! The write side: documents in (`add`), their per-scope statistics kept exact as rows die and
//! come back (`sync`), dead rows' postings dropped (`compact`).

use super::tokenize::for_each_token;
use super::{in_mask, Lexical, Postings, Scope, SyncReport, NO_DOC};
use crate::error::{Error, Result};

impl Lexical {
    fn ns_code(&mut self, name: &str) -> u32 {
        if let Some(&c) = self.ns_codes.get(name) {
            return c;
        }
        let c = self.ns_names.len() as u32;
        self.ns_codes.insert(name.to_owned(), c);
        self.ns_names.push(name.to_owned());
        self.ns_docs.push(0);
        self.ns_tokens.push(0);
        c
    }

    /// Index `texts` at `rows`, each in its namespace (`namespaces`: one name per text, or one
    /// for all). Rows must be new and increasing (above every indexed row), as vector rows
    /// are; otherwise a `Value` error and nothing is added. New documents are counted.
    pub fn add(&mut self, rows: &[u32], texts: &[&str], namespaces: &[&str]) -> Result<()> {
        self.check_add(rows, texts, namespaces)?;
        let mut buf = String::new();
        let mut ids: Vec<u32> = Vec::new();
        for (i, (&row, text)) in rows.iter().zip(texts).enumerate() {
            let ns = self.ns_code(namespaces[if namespaces.len() == 1 { 0 } else { i }]);
            self.term_ids(text, &mut buf, &mut ids);
            self.append_document(row, ns, &mut ids);
        }
        self.changes += 1;
        Ok(())
    }

    /// `add`'s arguments: one row per text, one namespace per text (or one for all), rows
    /// increasing and above every indexed row.
    fn check_add(&self, rows: &[u32], texts: &[&str], namespaces: &[&str]) -> Result<()> {
        if rows.len() != texts.len() {
            return Err(Error::Value(format!("{} rows for {} texts", rows.len(), texts.len())));
        }
        if namespaces.len() != texts.len() && !(namespaces.len() == 1 || texts.is_empty()) {
            return Err(Error::Value(format!("{} namespaces for {} texts", namespaces.len(), texts.len())));
        }
        let mut prev = self.doc_len.len() as i64 - 1;
        for &r in rows {
            if (r as i64) <= prev || r == u32::MAX {
                return Err(Error::Value(format!(
                    "row {r} is not above the highest indexed row ({prev}): rows are append-only"
                )));
            }
            prev = r as i64;
        }
        Ok(())
    }

    /// The term ids of `text`'s tokens into `ids` (one per token, in text order); words not
    /// seen before get new ids and empty postings.
    fn term_ids(&mut self, text: &str, buf: &mut String, ids: &mut Vec<u32>) {
        ids.clear();
        let (terms, words, postings) = (&mut self.terms, &mut self.words, &mut self.postings);
        for_each_token(text, buf, |t| {
            let id = match terms.get(t) {
                Some(&id) => id,
                None => {
                    let id = postings.len() as u32;
                    terms.insert(t.to_owned(), id);
                    words.push(t.to_owned());
                    postings.push(Postings::default());
                    id
                }
            };
            ids.push(id);
        });
    }

    /// Row `row` holds a document of namespace `ns` made of the terms `ids` (sorted here):
    /// one posting per distinct term, its forward list, its length; it is counted.
    fn append_document(&mut self, row: u32, ns: u32, ids: &mut [u32]) {
        let dl = ids.len() as u32;
        ids.sort_unstable();
        let ru = row as usize;
        // Rows skipped (no document) get empty forward lists.
        let off = *self.fwd_off.last().unwrap();
        self.fwd_off.resize(ru + 1, off);
        self.doc_len.resize(ru + 1, 0);
        self.doc_ns.resize(ru + 1, NO_DOC);
        self.counted.resize(ru + 1, false);
        self.max_tf.resize(self.postings.len(), 0);
        self.min_len.resize(self.postings.len(), u32::MAX);
        self.df_all.resize(self.postings.len(), 0);
        for run in ids.chunk_by(|a, b| a == b) {
            let t = run[0] as usize;
            let tf = run.len().min(u16::MAX as usize) as u16;
            let p = &mut self.postings[t];
            p.rows.push(row);
            p.tf.push(tf);
            self.max_tf[t] = self.max_tf[t].max(tf);
            self.min_len[t] = self.min_len[t].min(dl);
            self.fwd.push(run[0]);
            self.n_postings += 1;
        }
        self.fwd_off.push(self.fwd.len() as u64);
        self.doc_len[ru] = dl;
        self.doc_ns[ru] = ns;
        self.count(ru, true);
    }

    /// Add (`on`) or take out a document's contribution to the statistics.
    fn count(&mut self, row: usize, on: bool) {
        let ns = self.doc_ns[row];
        if ns == NO_DOC || self.counted[row] == on {
            return;
        }
        self.counted[row] = on;
        let dl = self.doc_len[row] as u64;
        let (a, b) = (self.fwd_off[row] as usize, self.fwd_off[row + 1] as usize);
        let n = ns as usize;
        if on {
            self.docs += 1;
            self.tokens += dl;
            self.ns_docs[n] += 1;
            self.ns_tokens[n] += dl;
            for &t in &self.fwd[a..b] {
                self.df_all[t as usize] += 1;
                *self.ns_df.entry((ns as u64) << 32 | t as u64).or_insert(0) += 1;
            }
        } else {
            self.docs -= 1;
            self.tokens -= dl;
            self.ns_docs[n] -= 1;
            self.ns_tokens[n] -= dl;
            for &t in &self.fwd[a..b] {
                self.df_all[t as usize] -= 1;
                let key = (ns as u64) << 32 | t as u64;
                if let Some(v) = self.ns_df.get_mut(&key) {
                    *v -= 1;
                    if *v == 0 {
                        self.ns_df.remove(&key);
                    }
                }
            }
        }
    }

    /// Make the counted documents the rows set in `live` (the store's live rows): rows that
    /// died leave the statistics, rows that came back (a document still held) rejoin. Rows past
    /// `live` count as dead. `missing`: live rows below `len()` holding no document (their text
    /// was never indexed or was compacted away: the caller rebuilds).
    pub fn sync(&mut self, live: &[u8]) -> SyncReport {
        let mut rep = SyncReport::default();
        for r in 0..self.doc_len.len() {
            let want = in_mask(live, r);
            if self.doc_ns[r] == NO_DOC {
                rep.missing += want as usize;
            } else if self.counted[r] != want {
                self.count(r, want);
                if want {
                    rep.revived += 1;
                } else {
                    rep.died += 1;
                }
            }
        }
        if rep.died + rep.revived > 0 {
            self.changes += 1;
        }
        rep
    }

    /// (documents, tokens) in `scope`.
    pub fn stats(&self, scope: Scope) -> (u64, u64) {
        match scope {
            Scope::All => (self.docs, self.tokens),
            Scope::Namespace(ns) => match self.ns_codes.get(ns) {
                Some(&c) => (self.ns_docs[c as usize], self.ns_tokens[c as usize]),
                None => (0, 0),
            },
            Scope::Mask(m) => {
                let mut docs = 0u64;
                let mut tokens = 0u64;
                for (r, &l) in self.doc_len.iter().enumerate() {
                    if self.doc_ns[r] != NO_DOC && in_mask(m, r) {
                        docs += 1;
                        tokens += l as u64;
                    }
                }
                (docs, tokens)
            }
        }
    }

    /// Counted documents in `scope` holding term `t`.
    pub(super) fn df(&self, t: u32, scope: Scope) -> u32 {
        match scope {
            Scope::All => self.df_all[t as usize],
            Scope::Namespace(ns) => match self.ns_codes.get(ns) {
                Some(&c) => self.ns_df.get(&((c as u64) << 32 | t as u64)).copied().unwrap_or(0),
                None => 0,
            },
            Scope::Mask(m) => {
                let p = &self.postings[t as usize];
                p.rows.iter().filter(|&&r| self.doc_ns[r as usize] != NO_DOC && in_mask(m, r as usize)).count() as u32
            }
        }
    }

    /// Take dead rows out (as `sync(live)`), then drop the postings and forward lists of every
    /// row not counted; returns the postings removed.
    pub fn compact(&mut self, live: &[u8]) -> usize {
        self.sync(live);
        let before = self.n_postings;
        let mut total = 0;
        for p in &mut self.postings {
            let mut w = 0;
            for i in 0..p.rows.len() {
                if self.counted[p.rows[i] as usize] {
                    p.rows[w] = p.rows[i];
                    p.tf[w] = p.tf[i];
                    w += 1;
                }
            }
            p.rows.truncate(w);
            p.tf.truncate(w);
            p.rows.shrink_to_fit();
            p.tf.shrink_to_fit();
            total += w;
        }
        let mut fwd = Vec::with_capacity(total);
        let mut off = Vec::with_capacity(self.fwd_off.len());
        off.push(0u64);
        for r in 0..self.doc_len.len() {
            if self.counted[r] {
                fwd.extend_from_slice(&self.fwd[self.fwd_off[r] as usize..self.fwd_off[r + 1] as usize]);
            } else {
                self.doc_len[r] = 0;
                self.doc_ns[r] = NO_DOC;
            }
            off.push(fwd.len() as u64);
        }
        self.fwd = fwd;
        self.fwd_off = off;
        for (t, p) in self.postings.iter().enumerate() {
            self.max_tf[t] = p.tf.iter().copied().max().unwrap_or(0);
            self.min_len[t] = p.rows.iter().map(|&r| self.doc_len[r as usize]).min().unwrap_or(u32::MAX);
        }
        self.n_postings = total;
        if before != total {
            self.changes += 1;
        }
        before - total
    }
}
