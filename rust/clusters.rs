//! Cluster state: centres with running sums, primary and secondary member lists, and the
//! operations that change them (assign, unassign, new/set/drop, k-means, split, merge).
//!
//! Layout choices (why):
//! - Clusters live in dense *slots* (`Vec<Cluster>`) with a contiguous centre matrix, so
//!   stage 1 of search and batched assignment read one `c x dim` block. Cluster ids are
//!   stable; the id -> slot map changes only on drop (swap-remove).
//! - Member lists are sorted `u32` row ids: stage 2 then walks the memory map in
//!   increasing address order, removal is a binary search, and 1M rows cost 4 MB.
//! - Running sums are f64, so adding and removing members for years does not drift.
//! - Per row: the primary slot (`u32`, with PENDING / DETACHED sentinels) and up to two
//!   secondary slots inline (8 bytes), overflowing to a hash map for rare wider rows.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};

use rayon::prelude::*;

use crate::coarse::{self, Coarse};
use crate::error::{Error, Result};
use crate::kernels;
use crate::kmeans::{self, KMeansConfig};
use crate::quant::{CentreCodes, QuantBlock};

/// Centres per block of `Clusters::merge_candidates` (a 256 x 3,000 block is 3 MB).
const MERGE_BLOCK: usize = 256;

/// Nearest centres a changed centre is compared with when `Clusters::merge_candidates` goes
/// through the routing layer (near-duplicates of one centre are a handful at most).
const MERGE_NEIGHBOURS: usize = 16;

/// A merge candidate: (smaller cluster id, larger id, cosine of their centres).
pub type MergePair = (i64, i64, f32);

/// The last `Clusters::merge_candidates` answer and the clusters whose centre was written
/// since: the next call compares only those with the rest (a pair of unchanged centres has
/// the same cosine as then).
struct MergeMemo {
    threshold: f32,
    pairs: Vec<MergePair>,
    changed: HashSet<i64>,
}

/// Row appended but never assigned: two-stage search scans these rows directly.
pub const PENDING: u32 = u32::MAX;
/// Row removed with `unassign` (deleted / archived): only flat search sees it.
pub const DETACHED: u32 = u32::MAX - 1;
const EMPTY: u32 = u32::MAX;

/// (rows, cluster ids n x k, scores n x k): `Clusters::near_assign`.
pub type NearAssignment = (Vec<i64>, Vec<i64>, Vec<f32>);

/// The 2-means of a split. An oversized cluster is cut where its members fall apart, and the
/// store re-assigns both halves' members among nearby centres right after, so the cut needs
/// no exact convergence: it stops once 1% of the members move (at most 8 rounds) instead of
/// 0.1% (20 rounds). Splits are frequent while a store grows (hundreds per 100k adds).
const SPLIT_KMEANS: KMeansConfig =
    KMeansConfig { max_iter: 8, sample_per_centre: 256, seed_per_centre: 16, full_passes: 2, settled_per_mille: 10 };

#[inline]
pub fn is_slot(s: u32) -> bool {
    s < DETACHED
}

pub struct Cluster {
    pub id: i64,
    /// Normalised anchor (a centre given from outside) and its weight.
    pub anchor: Option<Vec<f32>>,
    pub weight: f32,
    /// Sum of the primary members' vectors.
    pub sum: Vec<f64>,
    pub primary: Vec<u32>,
    pub secondary: Vec<u32>,
    /// False until the cluster has an anchor or members (its centre row is then zero and
    /// stage 1 / soft assignment skip it).
    pub has_centre: bool,
    /// Contiguous int8 copy of the primary members' vectors (in `primary` order), built by
    /// the first search that probes the cluster and dropped whenever `primary` changes.
    /// Stage 2 then streams one compact block instead of gathering rows scattered over the
    /// memory map (see `quant` for why int8 and how the shortlist is re-scored).
    pub cache: OnceLock<QuantBlock>,
}

impl Cluster {
    pub fn new(id: i64, anchor: Option<Vec<f32>>, weight: f32, sum: Vec<f64>, primary: Vec<u32>, secondary: Vec<u32>, has_centre: bool) -> Self {
        Cluster { id, anchor, weight, sum, primary, secondary, has_centre, cache: OnceLock::new() }
    }

    /// The primary members' vectors, quantised and contiguous (built on first use).
    pub fn member_codes(&self, data: &[f32], dim: usize) -> &QuantBlock {
        self.cache.get_or_init(|| {
            let rows = self.primary.iter().map(|&r| &data[r as usize * dim..(r as usize + 1) * dim]);
            QuantBlock::build(rows, dim)
        })
    }

    fn invalidate(&mut self) {
        self.cache = OnceLock::new();
    }
}

/// Add the rows of `add` to the sorted, duplicate-free `list`. Rows routed into a cluster are
/// usually new rows, larger than every member: then they are only appended. Sorting the whole
/// list instead made every routed batch cost as much as the members of every cluster it
/// touched, which is every cluster: O(store) per 1,024 rows routed, the rate falling as the
/// store grew.
fn merge_sorted(list: &mut Vec<u32>, add: &mut Vec<u32>) {
    if add.is_empty() {
        return;
    }
    add.sort_unstable();
    add.dedup();
    if list.last().is_none_or(|&l| l < add[0]) {
        list.append(add);
    } else {
        list.append(add);
        list.sort_unstable();
        list.dedup();
    }
}

/// What one `Clusters::apply` changed in one kind of member list (primary or secondary), per
/// slot: the lists touched, those that lost a row (only they need a scan; a list that only
/// gained rows is merged), and the (slot, row) pairs gained.
struct ListChanges {
    touched: Vec<bool>,
    left: Vec<bool>,
    gained: Vec<(u32, u32)>,
}

impl ListChanges {
    fn new(slots: usize) -> Self {
        ListChanges { touched: vec![false; slots], left: vec![false; slots], gained: Vec::new() }
    }

    #[inline]
    fn lose(&mut self, s: usize) {
        self.touched[s] = true;
        self.left[s] = true;
    }

    #[inline]
    fn gain(&mut self, s: u32, r: u32) {
        self.touched[s as usize] = true;
        self.gained.push((s, r));
    }

    /// The rows gained, per slot.
    fn gained_by_slot(&self) -> Vec<Vec<u32>> {
        let mut by_slot: Vec<Vec<u32>> = vec![Vec::new(); self.touched.len()];
        for &(s, r) in &self.gained {
            by_slot[s as usize].push(r);
        }
        by_slot
    }
}

/// Secondary memberships per row: two inline slots, overflow in a map.
#[derive(Default)]
pub struct Secondary {
    inline: Vec<[u32; 2]>,
    overflow: HashMap<u32, Vec<u32>>,
}

impl Secondary {
    fn grow(&mut self, n: usize) {
        self.inline.resize(n, [EMPTY, EMPTY]);
    }
    pub fn get(&self, r: u32) -> Vec<u32> {
        let mut v = Vec::new();
        self.get_into(r, &mut v);
        v
    }
    /// `get` into a buffer the caller reuses (no allocation per row in a re-assignment wave).
    pub fn get_into(&self, r: u32, out: &mut Vec<u32>) {
        out.clear();
        let i = self.inline[r as usize];
        if i[0] == EMPTY {
            return;
        }
        out.push(i[0]);
        if i[1] == EMPTY {
            return; // overflow only exists past two slots: no map lookup
        }
        out.push(i[1]);
        if let Some(o) = self.overflow.get(&r) {
            out.extend_from_slice(o);
        }
    }
    #[inline]
    pub fn contains(&self, r: u32, s: u32) -> bool {
        let i = self.inline[r as usize];
        if i[0] == s || i[1] == s {
            return true;
        }
        i[1] != EMPTY && self.overflow.get(&r).is_some_and(|o| o.contains(&s))
    }
    /// Does row r have a secondary slot among `probed[..upto]`?
    #[inline]
    pub fn any_in(&self, r: u32, probed: &[u32]) -> bool {
        let i = self.inline[r as usize];
        if i[0] == EMPTY {
            return false;
        }
        if probed.contains(&i[0]) || (i[1] != EMPTY && probed.contains(&i[1])) {
            return true;
        }
        i[1] != EMPTY && self.overflow.get(&r).is_some_and(|o| o.iter().any(|s| probed.contains(s)))
    }
    pub fn set(&mut self, r: u32, slots: &[u32]) {
        let e = &mut self.inline[r as usize];
        let had_two = e[1] != EMPTY; // an overflow entry can only exist then
        e[0] = slots.first().copied().unwrap_or(EMPTY);
        e[1] = slots.get(1).copied().unwrap_or(EMPTY);
        if slots.len() > 2 {
            self.overflow.insert(r, slots[2..].to_vec());
        } else if had_two {
            self.overflow.remove(&r);
        }
    }
}

pub struct Clusters {
    dim: usize,
    pub(crate) slots: Vec<Cluster>,
    /// slots x dim, normalised centres (zero rows where `has_centre` is false).
    pub(crate) centres: Vec<f32>,
    /// int8 copy of `centres` for stage 1 (`search::probe`); every write of a centre row
    /// re-encodes that row.
    centre_codes: CentreCodes,
    slot_of: HashMap<i64, usize>,
    pub(crate) next_id: i64,
    pub(crate) primary_of: Vec<u32>,
    pub(crate) sec: Secondary,
    /// Rows that may be PENDING (stale entries are skipped and compacted lazily).
    pub(crate) pending: Vec<u32>,
    n_pending: usize,
    /// Keep contiguous per-cluster int8 copies of member vectors for stage 2 (faster scans;
    /// about a quarter of the f32 vectors' size in memory once every cluster was probed).
    pub member_cache: bool,
    /// Set by `merge_candidates`, kept by every centre write (`refresh_centre`). A lock, not
    /// a plain field: `merge_candidates` runs under the index's read lock.
    merge_memo: Mutex<Option<MergeMemo>>,
}

impl Clusters {
    pub fn new(dim: usize) -> Self {
        Clusters {
            dim,
            slots: Vec::new(),
            centres: Vec::new(),
            centre_codes: CentreCodes::new(dim),
            slot_of: HashMap::new(),
            next_id: 0,
            primary_of: Vec::new(),
            sec: Secondary::default(),
            pending: Vec::new(),
            n_pending: 0,
            member_cache: true,
            merge_memo: Mutex::new(None),
        }
    }

    pub fn dim(&self) -> usize {
        self.dim
    }
    pub fn n_rows(&self) -> usize {
        self.primary_of.len()
    }
    pub fn len(&self) -> usize {
        self.slots.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
    pub fn slots(&self) -> &[Cluster] {
        &self.slots
    }
    pub fn centre_matrix(&self) -> &[f32] {
        &self.centres
    }
    pub fn centre_codes(&self) -> &CentreCodes {
        &self.centre_codes
    }
    pub fn has_centres(&self) -> Vec<bool> {
        self.slots.iter().map(|c| c.has_centre).collect()
    }
    pub fn n_pending(&self) -> usize {
        self.n_pending
    }
    /// Rows that are PENDING right now.
    pub fn pending_rows(&self) -> impl Iterator<Item = u32> + '_ {
        self.pending.iter().copied().filter(|&r| self.primary_of[r as usize] == PENDING)
    }

    /// Register rows appended to the vector file (they start PENDING).
    pub fn grow_rows(&mut self, n: usize) {
        let old = self.primary_of.len();
        if n <= old {
            return;
        }
        self.primary_of.resize(n, PENDING);
        self.sec.grow(n);
        self.pending.extend(old as u32..n as u32);
        self.n_pending += n - old;
    }

    pub fn slot(&self, id: i64) -> Result<usize> {
        self.slot_of.get(&id).copied().ok_or_else(|| Error::Key(format!("unknown cluster id {id}")))
    }

    pub fn cluster(&self, id: i64) -> Result<&Cluster> {
        Ok(&self.slots[self.slot(id)?])
    }

    /// Cluster id of a slot value (-1 for PENDING / DETACHED).
    #[inline]
    pub fn id_of_slot(&self, s: u32) -> i64 {
        if is_slot(s) {
            self.slots[s as usize].id
        } else {
            -1
        }
    }

    /// Ids ordered ascending, with their slots.
    pub fn ordered(&self) -> Vec<(i64, usize)> {
        let mut v: Vec<(i64, usize)> = self.slots.iter().enumerate().map(|(s, c)| (c.id, s)).collect();
        v.sort_unstable();
        v
    }

    pub fn check_row(&self, r: i64) -> Result<u32> {
        if r < 0 || r as usize >= self.primary_of.len() {
            return Err(Error::Key(format!("unknown row id {r} (the index has {} rows)", self.primary_of.len())));
        }
        Ok(r as u32)
    }

    pub fn cluster_of(&self, r: i64) -> Result<i64> {
        let r = self.check_row(r)?;
        Ok(self.id_of_slot(self.primary_of[r as usize]))
    }

    /// Secondary cluster ids of a row.
    pub fn secondary_of(&self, r: i64) -> Result<Vec<i64>> {
        let r = self.check_row(r)?;
        Ok(self.sec.get(r).into_iter().map(|s| self.id_of_slot(s)).collect())
    }

    fn check_anchor(&self, v: &[f32], weight: f32) -> Result<Vec<f32>> {
        if !(weight.is_finite() && weight >= 0.0) {
            return Err(Error::Value(format!("weight must be finite and >= 0, got {weight}")));
        }
        if v.len() != self.dim {
            return Err(Error::Value(format!("centre has {} values, expected dim {}", v.len(), self.dim)));
        }
        kernels::normalized(v, self.dim, "centre")
    }

    /// New cluster, optionally anchored at `centre` with `weight`; returns its id.
    pub fn new_cluster(&mut self, centre: Option<&[f32]>, weight: f32) -> Result<i64> {
        let anchor = match centre {
            Some(v) => Some(self.check_anchor(v, weight)?),
            None => None,
        };
        let id = self.push_slot(anchor, weight, None);
        Ok(id)
    }

    fn push_slot(&mut self, anchor: Option<Vec<f32>>, weight: f32, centre: Option<&[f32]>) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        let s = self.slots.len();
        self.slots.push(Cluster::new(id, anchor, weight, vec![0.0; self.dim], Vec::new(), Vec::new(), false));
        self.centres.resize((s + 1) * self.dim, 0.0);
        if let Some(c) = centre {
            self.centres[s * self.dim..(s + 1) * self.dim].copy_from_slice(c);
            self.slots[s].has_centre = true;
        }
        self.slot_of.insert(id, s);
        self.refresh_centre(s);
        id
    }

    /// Anchor an existing cluster: centre = normalise(weight * anchor + sum(members)).
    pub fn set_centre(&mut self, id: i64, v: &[f32], weight: f32) -> Result<()> {
        let s = self.slot(id)?;
        let a = self.check_anchor(v, weight)?;
        self.slots[s].anchor = Some(a);
        self.slots[s].weight = weight;
        self.refresh_centre(s);
        Ok(())
    }

    /// Recompute a centre from its anchor and running sum. With neither (an emptied k-means
    /// cluster) the previous centre is kept, so the cluster can still attract rows.
    pub(crate) fn refresh_centre(&mut self, s: usize) {
        let dim = self.dim;
        let c = &self.slots[s];
        let dst = &mut self.centres[s * dim..(s + 1) * dim];
        // Every cluster an add or a re-assignment touches is refreshed (hundreds per routed
        // chunk of rows): no copy of the sum unless an anchor must be added to it.
        let ok = match &c.anchor {
            None => kernels::normalize_f64_into(&c.sum, dst),
            Some(a) => {
                let v: Vec<f64> = c.sum.iter().zip(a).map(|(&x, &y)| x + c.weight as f64 * y as f64).collect();
                kernels::normalize_f64_into(&v, dst)
            }
        };
        if ok {
            self.slots[s].has_centre = true;
        }
        self.centre_codes.set(s, &self.centres[s * dim..(s + 1) * dim]);
        if let Some(m) = self.merge_memo.get_mut().unwrap_or_else(|e| e.into_inner()) {
            m.changed.insert(self.slots[s].id);
        }
    }

    /// Drop an empty cluster (secondary links to it are removed). Error if it still has
    /// primary members.
    pub fn drop_cluster(&mut self, id: i64) -> Result<()> {
        let s = self.slot(id)?;
        let n = self.slots[s].primary.len();
        if n > 0 {
            return Err(Error::Value(format!("cluster {id} still has {n} members; move or unassign them first")));
        }
        for r in std::mem::take(&mut self.slots[s].secondary) {
            let mut v = self.sec.get(r);
            v.retain(|&x| x != s as u32);
            self.sec.set(r, &v);
        }
        self.remove_slot(s);
        Ok(())
    }

    /// Swap-remove slot `s`, renumbering the moved last slot in every row that names it.
    fn remove_slot(&mut self, s: usize) {
        let last = self.slots.len() - 1;
        let dim = self.dim;
        let removed = self.slots.swap_remove(s);
        self.slot_of.remove(&removed.id);
        if s != last {
            let (old, new) = (last as u32, s as u32);
            let moved = &self.slots[s];
            for &r in &moved.primary {
                self.primary_of[r as usize] = new;
            }
            for &r in &moved.secondary {
                let mut v = self.sec.get(r);
                v.iter_mut().filter(|x| **x == old).for_each(|x| *x = new);
                self.sec.set(r, &v);
            }
            self.slot_of.insert(moved.id, s);
            self.centres.copy_within(last * dim..(last + 1) * dim, s * dim);
            self.centre_codes.set(s, &self.centres[s * dim..(s + 1) * dim]);
        }
        self.centres.truncate(last * dim);
        self.centre_codes.truncate(last);
    }

    /// Set memberships of `rows` (deduplicated: the last occurrence wins).
    /// `prim[i]` is a slot, PENDING or DETACHED; `secs` replaces the secondary slots when
    /// given, else they are kept (minus the new primary). `data` holds every row's vector.
    fn apply(&mut self, rows: &[u32], prim: &[u32], secs: Option<&[Vec<u32>]>, data: &[f32]) {
        let ns = self.slots.len();
        let (mut primary, mut secondary) = (ListChanges::new(ns), ListChanges::new(ns));
        // Last occurrence wins: walk backwards and skip rows already handled (a bitmap over
        // every row: one bit test per row, where a hash set cost more than the rest of a
        // large re-assignment wave's bookkeeping).
        let mut seen = vec![0u64; self.primary_of.len().div_ceil(64)];
        let (mut old_sec, mut kept) = (Vec::new(), Vec::new());
        for i in (0..rows.len()).rev() {
            let r = rows[i];
            let (word, bit) = (r as usize / 64, 1u64 << (r % 64));
            if seen[word] & bit != 0 {
                continue;
            }
            seen[word] |= bit;
            self.move_primary(r, prim[i], data, &mut primary);
            self.sec.get_into(r, &mut old_sec);
            let new_sec = secs.map_or(&old_sec[..], |s| &s[i]);
            self.set_secondary(r, prim[i], new_sec, &old_sec, &mut kept, &mut secondary);
        }
        self.update_lists(primary, secondary);
        self.compact_pending();
    }

    /// Make `new` (a slot, PENDING or DETACHED) row `r`'s primary: the running sums of the old
    /// and new clusters and the pending count follow.
    #[inline]
    fn move_primary(&mut self, r: u32, new: u32, data: &[f32], changes: &mut ListChanges) {
        let old = self.primary_of[r as usize];
        if old == new {
            return;
        }
        let dim = self.dim;
        let v = &data[r as usize * dim..(r as usize + 1) * dim];
        if is_slot(old) {
            changes.lose(old as usize);
            for (a, &x) in self.slots[old as usize].sum.iter_mut().zip(v) {
                *a -= x as f64;
            }
        }
        if is_slot(new) {
            changes.gain(new, r);
            for (a, &x) in self.slots[new as usize].sum.iter_mut().zip(v) {
                *a += x as f64;
            }
        }
        if old == PENDING {
            self.n_pending -= 1;
        }
        if new == PENDING {
            self.n_pending += 1;
            self.pending.push(r);
        }
        self.primary_of[r as usize] = new;
    }

    /// Make `new_sec` without the primary `prim` and without repeats (built in `kept`) row `r`'s
    /// secondary slots, `old_sec` being its current ones.
    #[inline]
    fn set_secondary(&mut self, r: u32, prim: u32, new_sec: &[u32], old_sec: &[u32], kept: &mut Vec<u32>,
                     changes: &mut ListChanges) {
        kept.clear();
        for &s in new_sec {
            if s != prim && !kept.contains(&s) {
                kept.push(s);
            }
        }
        for &s in old_sec {
            if !kept.contains(&s) {
                changes.lose(s as usize);
            }
        }
        for &s in kept.iter() {
            if !old_sec.contains(&s) {
                changes.gain(s, r);
            }
        }
        if kept[..] != old_sec[..] {
            self.sec.set(r, kept);
        }
    }

    /// Bring the member lists `apply` changed up to date (rows that left filtered out, rows
    /// gained merged in) and refresh the centres whose primary members changed.
    fn update_lists(&mut self, primary: ListChanges, secondary: ListChanges) {
        let mut add_p = primary.gained_by_slot();
        let mut add_s = secondary.gained_by_slot();
        for s in 0..self.slots.len() {
            if primary.touched[s] {
                self.slots[s].invalidate();
                let po = &self.primary_of;
                let list = &mut self.slots[s].primary;
                if primary.left[s] {
                    list.retain(|&r| po[r as usize] == s as u32);
                }
                merge_sorted(list, &mut add_p[s]);
            }
            if secondary.touched[s] {
                let sec = &self.sec;
                let list = &mut self.slots[s].secondary;
                if secondary.left[s] {
                    list.retain(|&r| sec.contains(r, s as u32));
                }
                merge_sorted(list, &mut add_s[s]);
            }
        }
        for (s, &t) in primary.touched.iter().enumerate() {
            if t {
                self.refresh_centre(s);
            }
        }
    }

    /// Drop stale entries (rows no longer PENDING) from `pending` once they outnumber the
    /// pending rows.
    fn compact_pending(&mut self) {
        if self.pending.len() > 2 * self.n_pending + 1024 {
            let po = &self.primary_of;
            self.pending.retain(|&r| po[r as usize] == PENDING);
            self.pending.sort_unstable();
            self.pending.dedup();
        }
    }

    /// Public assignment: `targets` is rows x width cluster ids; column 0 is the primary
    /// (-1: the row is unassigned, and then every column must be -1), the other columns are
    /// secondary memberships (-1 = none). Everything is validated before any change.
    pub fn assign(&mut self, rows: &[i64], targets: &[i64], width: usize, data: &[f32]) -> Result<()> {
        if width == 0 || targets.len() != rows.len() * width {
            return Err(Error::Value(format!(
                "cluster_ids must have one row per row id: got {} ids for {} rows",
                targets.len(),
                rows.len()
            )));
        }
        let mut rr = Vec::with_capacity(rows.len());
        let mut prim = Vec::with_capacity(rows.len());
        let mut secs = Vec::with_capacity(rows.len());
        for (i, &r) in rows.iter().enumerate() {
            rr.push(self.check_row(r)?);
            let t = &targets[i * width..(i + 1) * width];
            if t[0] < 0 {
                if t[0] != -1 || t[1..].iter().any(|&x| x != -1) {
                    return Err(Error::Value(format!(
                        "row {r}: a row without a primary cluster (column 0 = -1) cannot have secondary ones; got {t:?}"
                    )));
                }
                prim.push(DETACHED);
                secs.push(Vec::new());
                continue;
            }
            prim.push(self.slot(t[0])? as u32);
            let mut s = Vec::new();
            for &c in &t[1..] {
                if c == -1 {
                    continue;
                }
                if c < 0 {
                    return Err(Error::Value(format!("row {r}: bad cluster id {c}")));
                }
                s.push(self.slot(c)? as u32);
            }
            secs.push(s);
        }
        self.apply(&rr, &prim, Some(&secs), data);
        Ok(())
    }

    /// Remove rows from every cluster (they become DETACHED: only flat search sees them).
    pub fn unassign(&mut self, rows: &[i64], data: &[f32]) -> Result<()> {
        let rr = rows.iter().map(|&r| self.check_row(r)).collect::<Result<Vec<u32>>>()?;
        let empty = vec![Vec::new(); rr.len()];
        self.apply(&rr, &vec![DETACHED; rr.len()], Some(&empty), data);
        Ok(())
    }

    /// Primary members of a cluster (sorted row ids).
    pub fn members(&self, id: i64) -> Result<&[u32]> {
        Ok(&self.cluster(id)?.primary)
    }

    /// Move every primary member of `absorb` into `keep` (sums add up, no rescan), move its
    /// secondary links too, then drop `absorb`.
    pub fn merge(&mut self, keep: i64, absorb: i64, data: &[f32]) -> Result<()> {
        self.merge_many(&[(keep, absorb)], data)
    }

    /// `merge` for every (keep, absorb) pair, in one pass over the member lists: a fold of
    /// thousands of tiny clusters (isotropic data opens a cluster for most rows) cost one
    /// list and centre update per pair, each as large as the cluster table. Every absorbed
    /// cluster is listed once and none is also kept (a chain has no single answer); nothing
    /// changes unless every pair is valid.
    pub fn merge_many(&mut self, pairs: &[(i64, i64)], data: &[f32]) -> Result<()> {
        let mut into: HashMap<u32, u32> = HashMap::with_capacity(pairs.len());
        for &(keep, absorb) in pairs {
            if keep == absorb {
                return Err(Error::Value(format!("cannot merge cluster {keep} into itself")));
            }
            let (k, a) = (self.slot(keep)? as u32, self.slot(absorb)? as u32);
            if into.insert(a, k).is_some() {
                return Err(Error::Value(format!("cluster {absorb} is absorbed twice")));
            }
        }
        if let Some(&(keep, _)) = pairs.iter().find(|(k, _)| into.contains_key(&(self.slot_of[k] as u32))) {
            return Err(Error::Value(format!("cluster {keep} is both kept and absorbed")));
        }
        let (mut rows, mut prim) = (Vec::new(), Vec::new());
        for (&a, &k) in &into {
            rows.extend_from_slice(&self.slots[a as usize].primary);
            prim.resize(rows.len(), k);
        }
        self.apply(&rows, &prim, None, data);
        let mut srows: Vec<u32> = into.keys().flat_map(|&a| self.slots[a as usize].secondary.iter().copied()).collect();
        srows.sort_unstable();
        srows.dedup();
        let secs: Vec<Vec<u32>> =
            srows.iter().map(|&r| self.sec.get(r).into_iter().map(|s| into.get(&s).copied().unwrap_or(s)).collect()).collect();
        let prims: Vec<u32> = srows.iter().map(|&r| self.primary_of[r as usize]).collect();
        self.apply(&srows, &prims, Some(&secs), data);
        for &(_, absorb) in pairs {
            self.drop_cluster(absorb)?;
        }
        Ok(())
    }

    /// For each cluster of `ids`, the cluster of `among` whose centre is most similar to its
    /// centre, and that cosine (-1 / -inf where `among` has no centre). Against the centre
    /// matrix in place (no copy of every centre), through `coarse` when given
    /// (`centre_neighbours`).
    pub fn nearest_among(&self, ids: &[i64], among: &[i64], coarse: Option<&Coarse>) -> Result<(Vec<i64>, Vec<f32>)> {
        let dim = self.dim;
        let slots: Vec<usize> = ids.iter().map(|&id| self.slot(id)).collect::<Result<_>>()?;
        let mut allowed = vec![false; self.slots.len()];
        for &id in among {
            let s = self.slot(id)?;
            allowed[s] = self.slots[s].has_centre;
        }
        let mut own = Vec::with_capacity(slots.len() * dim);
        for &s in &slots {
            own.extend_from_slice(&self.centres[s * dim..(s + 1) * dim]);
        }
        let mut nid = vec![-1i64; slots.len()];
        let mut nsc = vec![f32::NEG_INFINITY; slots.len()];
        if !slots.is_empty() && allowed.iter().any(|&a| a) {
            self.centre_neighbours(&own, 1, &allowed, coarse, &mut nid, &mut nsc);
        }
        Ok((nid.into_iter().map(|s| if s >= 0 { self.slots[s as usize].id } else { -1 }).collect(), nsc))
    }

    /// The best `k` centres (slots) among `valid` of each row of `rows` (normalised, n x dim):
    /// through `coarse` when given (the routing layer: a few groups of centres per row
    /// instead of every centre; a row whose best centre lies in a group it did not probe gets
    /// the best of the groups it did, see `coarse`), else exactly. Organisation asks this for
    /// centres of clusters that changed; with isotropic data most rows open a cluster, so
    /// there are thousands per pass, each against every centre when exact: at 200k
    /// isotropic memories (35k clusters) those products were most of the add time.
    fn centre_neighbours(&self, rows: &[f32], k: usize, valid: &[bool], coarse: Option<&Coarse>, ids: &mut [i64],
                         scores: &mut [f32]) {
        match coarse {
            Some(c) => coarse::top_centres(rows, &self.centres, self.dim, k, valid, c, Some(&self.centre_codes), ids, scores),
            None => kernels::top_centres(rows, &self.centres, self.dim, k, Some(valid), ids, scores),
        }
    }

    /// Re-assignment after a split, merge or drift: the primary members of clusters `ids` (in
    /// that order), each scored against its cluster's `near` nearest centres (its own
    /// included) instead of every centre. A member's best centres lie next to the one it was
    /// routed to. Returns (rows, cluster ids, scores), the last two n x `k`, best first,
    /// padded with -1 / -inf (fewer than `k` near centres). Parallel over the clusters.
    pub fn near_assign(&self, ids: &[i64], near: usize, k: usize, data: &[f32], coarse: Option<&Coarse>) -> Result<NearAssignment> {
        let dim = self.dim;
        let slots: Vec<usize> = ids.iter().map(|&id| self.slot(id)).collect::<Result<_>>()?;
        let valid = self.has_centres();
        let near = near.min(valid.iter().filter(|&&v| v).count());
        if k == 0 {
            return Err(Error::Value("k must be >= 1".into()));
        }
        if near == 0 || slots.is_empty() {
            return Ok((Vec::new(), Vec::new(), Vec::new()));
        }
        // Every cluster's nearest centres in one product.
        let mut own = vec![0.0f32; slots.len() * dim];
        for (j, &s) in slots.iter().enumerate() {
            own[j * dim..(j + 1) * dim].copy_from_slice(&self.centres[s * dim..(s + 1) * dim]);
        }
        let mut nid = vec![-1i64; slots.len() * near];
        let mut nsc = vec![f32::NEG_INFINITY; slots.len() * near];
        self.centre_neighbours(&own, near, &valid, coarse, &mut nid, &mut nsc);
        drop(own);
        let parts: Vec<NearAssignment> = slots
            .par_iter()
            .enumerate()
            .map(|(j, &s)| {
                let members = &self.slots[s].primary;
                let nb: Vec<u32> = nid[j * near..(j + 1) * near].iter().filter(|&&x| x >= 0).map(|&x| x as u32).collect();
                if members.is_empty() || nb.is_empty() {
                    return (Vec::new(), Vec::new(), Vec::new());
                }
                let b = kmeans::gather(&self.centres, &nb, dim);
                let a = kmeans::gather(data, members, dim);
                let kk = k.min(nb.len());
                let mut li = vec![-1i64; members.len() * kk];
                let mut ls = vec![f32::NEG_INFINITY; members.len() * kk];
                kernels::top_centres(&a, &b, dim, kk, None, &mut li, &mut ls);
                let mut out_ids = vec![-1i64; members.len() * k];
                let mut out_sc = vec![f32::NEG_INFINITY; members.len() * k];
                for i in 0..members.len() {
                    for c in 0..kk {
                        let l = li[i * kk + c];
                        if l >= 0 {
                            out_ids[i * k + c] = self.slots[nb[l as usize] as usize].id;
                            out_sc[i * k + c] = ls[i * kk + c];
                        }
                    }
                }
                (members.iter().map(|&r| r as i64).collect(), out_ids, out_sc)
            })
            .collect();
        let n: usize = parts.iter().map(|p| p.0.len()).sum();
        let (mut rows, mut out_ids, mut out_sc) = (Vec::with_capacity(n), Vec::with_capacity(n * k), Vec::with_capacity(n * k));
        for (r, i, sc) in parts {
            rows.extend(r);
            out_ids.extend(i);
            out_sc.extend(sc);
        }
        Ok((rows, out_ids, out_sc))
    }

    /// Pairs of clusters whose centres have cosine >= threshold: (a, b, cos), a < b, best first.
    ///
    /// In blocks of `MERGE_BLOCK` centres against the centres from the block's first on (the
    /// upper triangle of the c x c product: half its arithmetic), blocks side by side on the
    /// rayon pool. One c x c product was 36 MB to fill and scan at 3,000 centres and ran on
    /// one core: 0.16 s of every periodic organisation of a 1M store (AVX2 EPYC).
    ///
    /// After the first call only the centres written since the last one (new clusters, those
    /// that gained or lost members) are compared with every centre; the pairs of the others
    /// are the last answer's (the same pairs as comparing every pair again, with the same
    /// threshold; `merge_candidates_all` does that). At 5,000 isotropic memories in 1,174
    /// clusters about a third of the centres change between periodic organisations.
    ///
    /// With `coarse` (the routing layer, past `coarse::COARSE_MIN` centres) each changed centre
    /// is compared only with its `MERGE_NEIGHBOURS` nearest centres that the layer finds (all
    /// of them when every one of those reaches the threshold): isotropic data opens a cluster
    /// for most rows, so thousands of centres change between passes, and comparing each with
    /// every centre cost as much as routing every row exactly. A pair that close shares a
    /// group almost always; one the layer misses is found when either centre changes again.
    pub fn merge_candidates(&self, threshold: f32, coarse: Option<&Coarse>) -> Vec<MergePair> {
        let mut memo = self.merge_memo.lock().unwrap_or_else(|e| e.into_inner());
        let out = match memo.take() {
            Some(m) if m.threshold.to_bits() == threshold.to_bits() => self.merge_candidates_since(m, coarse),
            _ => self.merge_candidates_all(threshold),
        };
        *memo = Some(MergeMemo { threshold, pairs: out.clone(), changed: HashSet::new() });
        out
    }

    /// `merge_candidates` from the last answer: its pairs of unchanged live clusters, plus
    /// every pair with a changed centre, each such pair compared once.
    fn merge_candidates_since(&self, m: MergeMemo, coarse: Option<&Coarse>) -> Vec<MergePair> {
        let (c, dim, threshold) = (self.slots.len(), self.dim, m.threshold);
        let live = |id: &i64| self.slot_of.contains_key(id);
        let mut out: Vec<MergePair> = m
            .pairs
            .into_iter()
            .filter(|(a, b, _)| !m.changed.contains(a) && !m.changed.contains(b) && live(a) && live(b))
            .collect();
        let mut changed: Vec<usize> =
            m.changed.iter().filter_map(|id| self.slot_of.get(id).copied()).filter(|&s| self.slots[s].has_centre).collect();
        changed.sort_unstable();
        if let Some(co) = coarse {
            // The changed centres whose neighbours all reach the threshold (there may be more)
            // go on to the exact comparison below.
            let k = MERGE_NEIGHBOURS.min(c);
            let mut own = Vec::with_capacity(changed.len() * dim);
            for &s in &changed {
                own.extend_from_slice(&self.centres[s * dim..(s + 1) * dim]);
            }
            let (mut nid, mut nsc) = (vec![-1i64; changed.len() * k], vec![f32::NEG_INFINITY; changed.len() * k]);
            self.centre_neighbours(&own, k, &self.has_centres(), Some(co), &mut nid, &mut nsc);
            let mut full = Vec::new();
            for (i, &s) in changed.iter().enumerate() {
                let (ids, sc) = (&nid[i * k..(i + 1) * k], &nsc[i * k..(i + 1) * k]);
                if k < c && sc[k - 1] >= threshold {
                    full.push(s);
                    continue;
                }
                for (&j, &score) in ids.iter().zip(sc) {
                    if j >= 0 && j as usize != s && score >= threshold {
                        let (a, b) = (self.slots[s].id, self.slots[j as usize].id);
                        out.push((a.min(b), a.max(b), score));
                    }
                }
            }
            // A pair of two changed centres may be found from both sides.
            out.sort_by_key(|p| (p.0, p.1));
            out.dedup_by(|x, y| (x.0, x.1) == (y.0, y.1));
            if !full.is_empty() {
                let found: HashSet<(i64, i64)> = out.iter().map(|p| (p.0, p.1)).collect();
                let mut is_full = vec![false; c];
                for &s in &full {
                    is_full[s] = true;
                }
                let exact = self.pairs_with(&full, &is_full, threshold);
                out.extend(exact.into_iter().filter(|p| !found.contains(&(p.0, p.1))));
            }
            out.sort_by(|x, y| y.2.total_cmp(&x.2).then((x.0, x.1).cmp(&(y.0, y.1))));
            return out;
        }
        let mut is_changed = vec![false; c];
        for &s in &changed {
            is_changed[s] = true;
        }
        out.extend(self.pairs_with(&changed, &is_changed, threshold));
        out.sort_by(|x, y| y.2.total_cmp(&x.2).then((x.0, x.1).cmp(&(y.0, y.1))));
        out
    }

    /// Pairs (a, b, cos >= threshold) of each centre of `changed` (sorted slots) with every
    /// centre; a pair of two `is_changed` slots is taken from the lower slot's row only.
    fn pairs_with(&self, changed: &[usize], is_changed: &[bool], threshold: f32) -> Vec<MergePair> {
        let (c, dim) = (self.slots.len(), self.dim);
        let mut out = Vec::new();
        out.par_extend(changed.par_chunks(MERGE_BLOCK).flat_map_iter(|block| {
            let mut a = Vec::with_capacity(block.len() * dim);
            for &s in block {
                a.extend_from_slice(&self.centres[s * dim..(s + 1) * dim]);
            }
            let mut g = vec![0.0f32; block.len() * c];
            kernels::gemm_nt(&a, &self.centres[..c * dim], dim, &mut g);
            let mut found = Vec::new();
            for (k, &i) in block.iter().enumerate() {
                let row = &g[k * c..(k + 1) * c];
                for j in 0..c {
                    // A pair of two changed centres is taken from the lower slot's row.
                    if j == i || (is_changed[j] && j < i) || !self.slots[j].has_centre || row[j] < threshold {
                        continue;
                    }
                    let (a, b) = (self.slots[i].id, self.slots[j].id);
                    found.push((a.min(b), a.max(b), row[j]));
                }
            }
            found.into_iter()
        }));
        out
    }

    /// Every pair of centres compared (the first `merge_candidates`, or a new threshold).
    pub fn merge_candidates_all(&self, threshold: f32) -> Vec<MergePair> {
        let (c, dim) = (self.slots.len(), self.dim);
        let starts: Vec<usize> = (0..c).step_by(MERGE_BLOCK).collect();
        let mut out: Vec<(i64, i64, f32)> = starts
            .into_par_iter()
            .flat_map_iter(|i0| {
                let i1 = (i0 + MERGE_BLOCK).min(c);
                let width = c - i0;
                let mut g = vec![0.0f32; (i1 - i0) * width];
                kernels::gemm_nt(&self.centres[i0 * dim..i1 * dim], &self.centres[i0 * dim..c * dim], dim, &mut g);
                let mut found = Vec::new();
                for i in i0..i1 {
                    if !self.slots[i].has_centre {
                        continue;
                    }
                    let row = &g[(i - i0) * width..(i - i0 + 1) * width];
                    for j in i + 1..c {
                        if self.slots[j].has_centre && row[j - i0] >= threshold {
                            let (a, b) = (self.slots[i].id, self.slots[j].id);
                            found.push((a.min(b), a.max(b), row[j - i0]));
                        }
                    }
                }
                found.into_iter()
            })
            .collect();
        out.sort_by(|x, y| y.2.total_cmp(&x.2).then((x.0, x.1).cmp(&(y.0, y.1))));
        out
    }

    /// Spherical k-means over `rows` (default: every row that is not DETACHED) into k new
    /// clusters; returns their ids. Secondary links are kept. Clusters that lose all their
    /// primary members here and have no anchor are dropped.
    pub fn kmeans(&mut self, k: usize, rows: Option<&[i64]>, seed: u64, data: &[f32]) -> Result<Vec<i64>> {
        let mut ids: Vec<u32> = match rows {
            Some(r) => r.iter().map(|&x| self.check_row(x)).collect::<Result<_>>()?,
            None => (0..self.n_rows() as u32).filter(|&r| self.primary_of[r as usize] != DETACHED).collect(),
        };
        ids.sort_unstable();
        ids.dedup();
        let km = kmeans::fit(data, &ids, self.dim, k, seed, &KMeansConfig::default())?;
        self.install(&ids, km, data)
    }

    /// Create clusters from a k-means result and move the rows into them.
    fn install(&mut self, ids: &[u32], km: kmeans::KMeans, data: &[f32]) -> Result<Vec<i64>> {
        let dim = self.dim;
        let k = km.centres.len() / dim;
        // Only the clusters these rows leave can be emptied by the move: the slots of their
        // current primaries (every slot was checked before: O(clusters) per split).
        let mut left: Vec<usize> = ids.iter().map(|&r| self.primary_of[r as usize]).filter(|&s| is_slot(s)).map(|s| s as usize).collect();
        left.sort_unstable();
        left.dedup();
        let before: Vec<(i64, bool)> = left.iter().map(|&s| (self.slots[s].id, !self.slots[s].primary.is_empty())).collect();
        let first_slot = self.slots.len() as u32;
        let new_ids: Vec<i64> =
            (0..k).map(|j| self.push_slot(None, 0.0, Some(&km.centres[j * dim..(j + 1) * dim]))).collect();
        let prim: Vec<u32> = km.labels.iter().map(|&l| first_slot + l).collect();
        self.apply(ids, &prim, None, data);
        for (id, had) in before {
            let s = self.slot(id)?;
            let c = &self.slots[s];
            if had && c.primary.is_empty() && c.anchor.is_none() {
                self.drop_cluster(id)?;
            }
        }
        Ok(new_ids)
    }

    /// 2-means on one cluster's primary members (`SPLIT_KMEANS`): two new clusters, the old one is dropped
    /// (its anchor with it). Returns the new ids.
    pub fn split(&mut self, id: i64, seed: u64, data: &[f32]) -> Result<(i64, i64)> {
        Ok(self.split_many(&[id], seed, data)?[0])
    }

    /// `split` for every cluster of `ids`, their 2-means fits side by side on the rayon pool
    /// (each reads only its own members), then installed in order: the (a, b) of each. Nothing
    /// changes unless every cluster exists, is listed once and has at least 2 members.
    pub fn split_many(&mut self, ids: &[i64], seed: u64, data: &[f32]) -> Result<Vec<(i64, i64)>> {
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        let mut members = Vec::with_capacity(ids.len());
        for &id in ids {
            let s = self.slot(id)?;
            if !seen.insert(id) {
                return Err(Error::Value(format!("cluster {id} is listed twice")));
            }
            let rows = self.slots[s].primary.clone();
            if rows.len() < 2 {
                return Err(Error::Value(format!("cluster {id} has {} members; a split needs at least 2", rows.len())));
            }
            members.push(rows);
        }
        let dim = self.dim;
        let fits = members.par_iter().map(|rows| kmeans::fit(data, rows, dim, 2, seed, &SPLIT_KMEANS)).collect::<Result<Vec<_>>>()?;
        let mut out = Vec::with_capacity(ids.len());
        for ((&id, rows), km) in ids.iter().zip(&members).zip(fits) {
            let new = self.install(rows, km, data)?;
            if self.slot_of.contains_key(&id) {
                self.drop_cluster(id)?;
            }
            out.push((new[0], new[1]));
        }
        Ok(out)
    }

    /// Drop memberships of rows >= n (after the vector file lost rows) and rebuild the
    /// affected sums from the remaining members.
    pub fn truncate_rows(&mut self, n: usize, data: &[f32]) {
        if self.primary_of.len() <= n {
            return;
        }
        let dim = self.dim;
        for s in 0..self.slots.len() {
            let c = &mut self.slots[s];
            let before = c.primary.len();
            c.primary.retain(|&r| (r as usize) < n);
            c.invalidate();
            c.secondary.retain(|&r| (r as usize) < n);
            if c.primary.len() != before {
                c.sum.iter_mut().for_each(|x| *x = 0.0);
                for &r in &c.primary {
                    for (a, &x) in c.sum.iter_mut().zip(&data[r as usize * dim..(r as usize + 1) * dim]) {
                        *a += x as f64;
                    }
                }
                self.refresh_centre(s);
            }
        }
        self.primary_of.truncate(n);
        self.sec.inline.truncate(n);
        self.sec.overflow.retain(|&r, _| (r as usize) < n);
        self.pending.retain(|&r| (r as usize) < n);
        self.n_pending = self.pending.iter().filter(|&&r| self.primary_of[r as usize] == PENDING).count();
    }

    /// Rebuild per-row state from the member lists (used after loading a saved state).
    /// Rows `< saved_rows` not in `pending` and not primary anywhere are DETACHED.
    pub(crate) fn from_parts(
        dim: usize,
        slots: Vec<Cluster>,
        centres: Vec<f32>,
        next_id: i64,
        saved_rows: usize,
        pending: Vec<u32>,
    ) -> Result<Self> {
        let mut c = Clusters::new(dim);
        c.next_id = next_id;
        c.primary_of = vec![DETACHED; saved_rows];
        c.sec.grow(saved_rows);
        for (s, cl) in slots.iter().enumerate() {
            if c.slot_of.insert(cl.id, s).is_some() || cl.id >= next_id || cl.id < 0 {
                return Err(Error::Io(format!("corrupt cluster state: bad or duplicate cluster id {}", cl.id)));
            }
            for &r in &cl.primary {
                let p = c.primary_of.get_mut(r as usize).ok_or_else(|| Error::Io(format!("corrupt cluster state: row {r} out of range")))?;
                if *p != DETACHED {
                    return Err(Error::Io(format!("corrupt cluster state: row {r} has two primary clusters")));
                }
                *p = s as u32;
            }
        }
        let mut secs: HashMap<u32, Vec<u32>> = HashMap::new();
        for (s, cl) in slots.iter().enumerate() {
            for &r in &cl.secondary {
                if r as usize >= saved_rows {
                    return Err(Error::Io(format!("corrupt cluster state: row {r} out of range")));
                }
                secs.entry(r).or_default().push(s as u32);
            }
        }
        for (r, v) in secs {
            c.sec.set(r, &v);
        }
        for &r in &pending {
            match c.primary_of.get_mut(r as usize) {
                Some(p) if *p == DETACHED => *p = PENDING,
                _ => return Err(Error::Io(format!("corrupt cluster state: bad pending row {r}"))),
            }
        }
        c.n_pending = pending.len();
        c.pending = pending;
        c.slots = slots;
        c.centre_codes = CentreCodes::from_rows(&centres, dim);
        c.centres = centres;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(dim: usize, hot: usize, noise: f32, seed: &mut kmeans::Rng) -> Vec<f32> {
        let mut v: Vec<f32> = (0..dim).map(|_| (seed.next_f64() as f32 - 0.5) * noise).collect();
        v[hot] += 1.0;
        kernels::normalized(&v, dim, "t").unwrap()
    }

    fn setup(n: usize) -> (Clusters, Vec<f32>) {
        let dim = 6;
        let mut rng = kmeans::Rng::new(1);
        let mut data = Vec::new();
        for i in 0..n {
            data.extend(unit(dim, i % 3, 0.2, &mut rng));
        }
        let mut c = Clusters::new(dim);
        c.grow_rows(n);
        (c, data)
    }

    fn check_sums(c: &Clusters, data: &[f32]) {
        let dim = c.dim();
        for cl in c.slots() {
            let mut s = vec![0.0f64; dim];
            for &r in &cl.primary {
                for (a, &x) in s.iter_mut().zip(&data[r as usize * dim..][..dim]) {
                    *a += x as f64;
                }
            }
            for (a, b) in s.iter().zip(&cl.sum) {
                assert!((a - b).abs() < 1e-9);
            }
            assert!(cl.primary.windows(2).all(|w| w[0] < w[1]));
        }
    }

    /// The same pairs, in the same order, with cosines equal to float rounding.
    fn same_pairs(got: &[MergePair], want: &[MergePair]) {
        assert_eq!(got.len(), want.len());
        let key = |v: &[MergePair]| {
            let mut k: Vec<(i64, i64)> = v.iter().map(|p| (p.0, p.1)).collect();
            k.sort_unstable();
            k
        };
        assert_eq!(key(got), key(want));
        let by: HashMap<(i64, i64), f32> = want.iter().map(|p| ((p.0, p.1), p.2)).collect();
        assert!(got.iter().all(|p| (by[&(p.0, p.1)] - p.2).abs() < 1e-5));
        assert!(got.windows(2).all(|w| w[0].2 >= w[1].2));
    }

    #[test]
    fn merge_candidates_from_the_last_answer_equal_every_pair_compared() {
        let (dim, n) = (16, 3_200);
        let mut rng = kmeans::Rng::new(7);
        let data: Vec<f32> = (0..n).flat_map(|i| unit(dim, i % 12, 0.6, &mut rng)).collect();
        let mut c = Clusters::new(dim);
        c.grow_rows(n);
        let ids: Vec<i64> = (0..700).map(|_| c.new_cluster(None, 1.0).unwrap()).collect();
        let rows: Vec<i64> = (0..700).collect();
        c.assign(&rows, &ids, 1, &data).unwrap();
        let mut next_row = 700i64;
        for round in 0..6 {
            let (inc, all) = (c.merge_candidates(0.9, None), c.merge_candidates_all(0.9));
            assert!(!all.is_empty(), "the data should give pairs at this threshold");
            same_pairs(&inc, &all);
            // Between calls: merges (the absorbed cluster is dropped), rows joining
            // clusters (more than a block of changed centres), new clusters, and a call at
            // another threshold, which compares every pair again.
            let live: Vec<i64> = c.slots().iter().map(|s| s.id).collect();
            for k in 0..20 {
                let (keep, absorb) = (live[(k * 31 + round) % live.len()], live[(k * 17 + 5 + round) % live.len()]);
                if keep != absorb && c.slot(keep).is_ok() && c.slot(absorb).is_ok() {
                    c.merge(keep, absorb, &data).unwrap();
                }
            }
            let live: Vec<i64> = c.slots().iter().map(|s| s.id).collect();
            let joined: Vec<i64> = (0..100).map(|k| next_row + k).collect();
            let to: Vec<i64> = (0..100).map(|k| live[(k as usize * 7 + round) % live.len()]).collect();
            c.assign(&joined, &to, 1, &data).unwrap();
            next_row += 100;
            let fresh: Vec<i64> = (0..300).map(|_| c.new_cluster(None, 1.0).unwrap()).collect();
            let rows: Vec<i64> = (0..300).map(|k| next_row + k).collect();
            c.assign(&rows, &fresh, 1, &data).unwrap();
            next_row += 300;
            if round == 3 {
                same_pairs(&c.merge_candidates(0.8, None), &c.merge_candidates_all(0.8));
            }
        }
        assert!(next_row <= n as i64);
    }

    #[test]
    fn assign_move_unassign_keep_sums_and_lists() {
        let (mut c, data) = setup(30);
        let a = c.new_cluster(None, 1.0).unwrap();
        let b = c.new_cluster(Some(&[0.0, 1.0, 0.0, 0.0, 0.0, 0.0]), 2.0).unwrap();
        assert_eq!(c.n_pending(), 30);
        let rows: Vec<i64> = (0..30).collect();
        let t: Vec<i64> = (0..30).flat_map(|r| if r % 2 == 0 { [a, b] } else { [b, -1] }).collect();
        c.assign(&rows, &t, 2, &data).unwrap();
        assert_eq!(c.n_pending(), 0);
        assert_eq!(c.members(a).unwrap().len(), 15);
        assert_eq!(c.cluster(b).unwrap().secondary.len(), 15);
        check_sums(&c, &data);
        c.unassign(&[0, 1], &data).unwrap();
        assert_eq!(c.cluster_of(0).unwrap(), -1);
        assert_eq!(c.cluster(b).unwrap().secondary.len(), 14);
        check_sums(&c, &data);
        assert!(matches!(c.drop_cluster(a), Err(Error::Value(_))));
        c.merge(b, a, &data).unwrap();
        assert!(matches!(c.members(a), Err(Error::Key(_))));
        assert_eq!(c.members(b).unwrap().len(), 28);
        assert!(c.cluster(b).unwrap().secondary.is_empty());
        check_sums(&c, &data);
        assert!(matches!(c.assign(&[99], &[b], 1, &data), Err(Error::Key(_))));
        assert!(matches!(c.assign(&[2], &[-1, b], 2, &data), Err(Error::Value(_))));
    }

    #[test]
    fn member_lists_stay_sorted_whether_rows_are_appended_or_interleaved() {
        let (mut c, data) = setup(40);
        let a = c.new_cluster(None, 1.0).unwrap();
        let b = c.new_cluster(None, 1.0).unwrap();
        // Batches in the order ingest sees them (each batch past every member: appended),
        // then out of order (rows below existing members: merged), then moves between lists.
        let batches: [Vec<i64>; 4] = [(10..20).collect(), (30..40).collect(), (0..10).rev().collect(), (20..30).collect()];
        for rows in &batches {
            let t: Vec<i64> = rows.iter().flat_map(|&r| if r % 3 == 0 { [a, b] } else { [b, a] }).collect();
            c.assign(rows, &t, 2, &data).unwrap();
        }
        let moved: Vec<i64> = vec![35, 3, 17];
        c.assign(&moved, &[a, -1, a, -1, b, a], 2, &data).unwrap();
        for id in [a, b] {
            let cl = c.cluster(id).unwrap();
            let want_p: Vec<u32> = (0..40u32).filter(|&r| c.cluster_of(r as i64).unwrap() == id).collect();
            assert_eq!(cl.primary, want_p);
            let want_s: Vec<u32> = (0..40u32).filter(|&r| c.sec.contains(r, c.slot(id).unwrap() as u32)).collect();
            assert_eq!(cl.secondary, want_s);
        }
        check_sums(&c, &data);
    }

    #[test]
    fn kmeans_and_split() {
        let (mut c, data) = setup(300);
        let ids = c.kmeans(3, None, 0, &data).unwrap();
        assert_eq!(ids.len(), 3);
        let sizes: Vec<usize> = ids.iter().map(|&i| c.members(i).unwrap().len()).collect();
        assert_eq!(sizes, vec![100, 100, 100]);
        check_sums(&c, &data);
        let (x, y) = c.split(ids[0], 0, &data).unwrap();
        assert!(matches!(c.members(ids[0]), Err(Error::Key(_))));
        assert_eq!(c.members(x).unwrap().len() + c.members(y).unwrap().len(), 100);
        check_sums(&c, &data);
        // Re-clustering everything drops the emptied, unanchored clusters.
        let again = c.kmeans(3, None, 0, &data).unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c.ordered().iter().map(|p| p.0).collect::<Vec<_>>(), again);
    }

    #[test]
    fn drop_renumbers_moved_slot() {
        let (mut c, data) = setup(9);
        let a = c.new_cluster(None, 1.0).unwrap();
        let b = c.new_cluster(None, 1.0).unwrap();
        let d = c.new_cluster(None, 1.0).unwrap();
        c.assign(&[0, 1], &[d, b, d, -1], 2, &data).unwrap();
        c.drop_cluster(a).unwrap();
        assert_eq!(c.cluster_of(0).unwrap(), d);
        assert_eq!(c.secondary_of(0).unwrap(), vec![b]);
        c.drop_cluster(b).unwrap();
        assert!(c.secondary_of(0).unwrap().is_empty());
        assert_eq!(c.members(d).unwrap(), &[0, 1]);
    }

    /// Eight clusters over 40 rows, with secondary links (some to the clusters that merge).
    fn eight_clusters() -> (Clusters, Vec<f32>, Vec<i64>) {
        let (mut c, data) = setup(40);
        let ids: Vec<i64> = (0..8).map(|_| c.new_cluster(None, 1.0).unwrap()).collect();
        let rows: Vec<i64> = (0..40).collect();
        let mut targets = Vec::new();
        for r in 0..40usize {
            targets.push(ids[r % 8]);
            targets.push(if r % 3 == 0 { ids[(r + 3) % 8] } else { -1 });
            targets.push(if r % 5 == 0 { ids[(r + 5) % 8] } else { -1 });
        }
        c.assign(&rows, &targets, 3, &data).unwrap();
        (c, data, ids)
    }

    #[test]
    fn merge_many_equals_one_merge_at_a_time() {
        let pairs = |ids: &[i64]| vec![(ids[0], ids[5]), (ids[1], ids[6]), (ids[0], ids[7])];
        let (mut one, data, ids) = eight_clusters();
        for (k, a) in pairs(&ids) {
            one.merge(k, a, &data).unwrap();
        }
        let (mut many, _, ids2) = eight_clusters();
        many.merge_many(&pairs(&ids2), &data).unwrap();
        check_sums(&many, &data);
        let mut a: Vec<i64> = one.slots().iter().map(|c| c.id).collect();
        let mut b: Vec<i64> = many.slots().iter().map(|c| c.id).collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
        for r in 0..40 {
            assert_eq!(one.cluster_of(r).unwrap(), many.cluster_of(r).unwrap());
            let (mut x, mut y) = (one.secondary_of(r).unwrap(), many.secondary_of(r).unwrap());
            x.sort_unstable();
            y.sort_unstable();
            assert_eq!(x, y, "row {r}");
        }
        for &id in &a {
            assert_eq!(one.members(id).unwrap(), many.members(id).unwrap());
            let (s1, s2) = (one.slot(id).unwrap(), many.slot(id).unwrap());
            let (c1, c2) = (&one.centres[s1 * 6..(s1 + 1) * 6], &many.centres[s2 * 6..(s2 + 1) * 6]);
            assert!(c1.iter().zip(c2).all(|(p, q)| (p - q).abs() < 1e-5));
        }
    }

    #[test]
    fn merge_many_rejects_chains_and_repeats_without_change() {
        let (mut c, data, ids) = eight_clusters();
        let before: Vec<i64> = (0..40).map(|r| c.cluster_of(r).unwrap()).collect();
        assert!(c.merge_many(&[(ids[0], ids[1]), (ids[1], ids[2])], &data).is_err());
        assert!(c.merge_many(&[(ids[0], ids[1]), (ids[2], ids[1])], &data).is_err());
        assert!(c.merge_many(&[(ids[0], ids[0])], &data).is_err());
        assert!(c.merge_many(&[(ids[0], 999)], &data).is_err());
        assert_eq!(c.len(), 8);
        assert_eq!(before, (0..40).map(|r| c.cluster_of(r).unwrap()).collect::<Vec<_>>());
    }

    #[test]
    fn nearest_among_is_the_best_cosine_of_the_allowed_centres() {
        let (c, _, ids) = eight_clusters();
        let (query, among) = (&ids[..3], &ids[3..]);
        let (got, sc) = c.nearest_among(query, among, None).unwrap();
        let centre = |id: i64| {
            let s = c.slot(id).unwrap();
            c.centres[s * 6..(s + 1) * 6].to_vec()
        };
        for (i, &q) in query.iter().enumerate() {
            let dot = |b: i64| centre(q).iter().zip(centre(b)).map(|(x, y)| x * y).sum::<f32>();
            let best = among.iter().copied().max_by(|&x, &y| dot(x).total_cmp(&dot(y))).unwrap();
            assert!((dot(got[i]) - dot(best)).abs() < 1e-5 && (sc[i] - dot(best)).abs() < 1e-4);
            assert!(among.contains(&got[i]));
        }
        let (none, _) = c.nearest_among(query, &[], None).unwrap();
        assert_eq!(none, vec![-1; 3]);
    }

    #[test]
    fn merge_candidates_through_the_routing_layer_find_the_near_duplicates() {
        let (dim, n) = (32, 2_000);
        let mut rng = kmeans::Rng::new(11);
        let mut data: Vec<f32> = Vec::with_capacity(n * dim);
        for i in 0..n {
            if i % 10 == 9 {
                // A near-duplicate of an earlier row (cosine ~0.97).
                let src = data[(i - 5) * dim..(i - 4) * dim].to_vec();
                let noise = unit(dim, i % dim, 4.0, &mut rng);
                let mut v: Vec<f32> = src.iter().zip(&noise).map(|(a, b)| a + 0.25 * b).collect();
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                v.iter_mut().for_each(|x| *x /= norm);
                data.extend(v);
            } else {
                data.extend(unit(dim, i % dim, 4.0, &mut rng));
            }
        }
        let mut c = Clusters::new(dim);
        c.grow_rows(n);
        let first = 1_500;
        let ids: Vec<i64> = (0..first).map(|_| c.new_cluster(None, 1.0).unwrap()).collect();
        c.assign(&(0..first as i64).collect::<Vec<_>>(), &ids, 1, &data).unwrap();
        let co = coarse::Coarse::build(&c.centres, &c.has_centres(), dim).expect("enough centres for the layer");
        same_pairs(&c.merge_candidates(0.9, Some(&co)), &c.merge_candidates_all(0.9));
        // New clusters (half of them near-duplicates of older ones) and rows joining old ones.
        let fresh: Vec<i64> = (first..n - 100).map(|_| c.new_cluster(None, 1.0).unwrap()).collect();
        c.assign(&(first as i64..(n - 100) as i64).collect::<Vec<_>>(), &fresh, 1, &data).unwrap();
        let to: Vec<i64> = (0..100).map(|k| ids[k * 13]).collect();
        c.assign(&((n - 100) as i64..n as i64).collect::<Vec<_>>(), &to, 1, &data).unwrap();
        let (got, all) = (c.merge_candidates(0.9, Some(&co)), c.merge_candidates_all(0.9));
        assert!(all.len() >= 150, "the data should give near-duplicate pairs: {}", all.len());
        same_pairs(&got, &all);
        // At a threshold most neighbours reach, the lists saturate and those centres are
        // compared with every centre.
        same_pairs(&c.merge_candidates(-1.0, Some(&co)), &c.merge_candidates_all(-1.0));
        let fresh: Vec<i64> = (0..50).map(|_| c.new_cluster(None, 1.0).unwrap()).collect();
        let moved: Vec<i64> = (0..50).map(|k| k * 7).collect();
        c.assign(&moved, &fresh, 1, &data).unwrap();
        same_pairs(&c.merge_candidates(-1.0, Some(&co)), &c.merge_candidates_all(-1.0));
    }
}
