//! Retention: which images of each tag name `gstore gc --keep-last N --keep-within DUR` keeps.
//!
//! An image of a tag name is the current value or a history entry of any of its versions,
//! dated by when it was set. Within one name, images are ranked newest first; one is kept if
//! its rank is below `keep_last` or it was set within `keep_within` of now. With neither
//! rule, everything is kept. A tag record is removed only when none of its images is kept;
//! otherwise its history is trimmed to the kept entries.

use crate::tag::TagRecord;
use std::collections::BTreeMap;

/// The retention rules (both optional; an image kept by either rule is kept).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// Keep the newest N images of each tag name.
    pub keep_last: Option<usize>,
    /// Keep the images set within this many seconds of now.
    pub keep_within_secs: Option<u64>,
}

/// What retention does to one tag record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Left as it is.
    Keep,
    /// History trimmed: the new record, and how many entries it lost.
    Trim(TagRecord, usize),
    /// Every image it names goes: the tag is removed.
    Remove,
}

impl Policy {
    /// True when no rule is set (gc keeps every tagged image).
    pub fn is_none(&self) -> bool {
        self.keep_last.is_none() && self.keep_within_secs.is_none()
    }

    /// The outcome for each of `records` (same order), at time `now`.
    pub fn apply(&self, records: &[TagRecord], now: u64) -> Vec<Outcome> {
        if self.is_none() {
            return vec![Outcome::Keep; records.len()];
        }
        // (set time, is current, record index, history index) per image, grouped by name.
        let mut by_name: BTreeMap<&str, Vec<(u64, bool, usize, usize)>> = BTreeMap::new();
        for (i, r) in records.iter().enumerate() {
            let items = by_name.entry(&r.name).or_default();
            items.push((r.set_unix, true, i, 0));
            items.extend(r.history.iter().enumerate().map(|(j, h)| (h.set_unix, false, i, j)));
        }
        let mut keep_current = vec![false; records.len()];
        let mut keep_history: Vec<Vec<bool>> = records.iter().map(|r| vec![false; r.history.len()]).collect();
        for items in by_name.values_mut() {
            items.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)).then(a.3.cmp(&b.3)));
            for (rank, &(set, current, i, j)) in items.iter().enumerate() {
                let kept = self.keep_last.is_some_and(|n| rank < n)
                    || self.keep_within_secs.is_some_and(|w| now.saturating_sub(set) <= w);
                if kept && current {
                    keep_current[i] = true;
                } else if kept {
                    keep_history[i][j] = true;
                }
            }
        }
        records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let kept_history = keep_history[i].iter().filter(|k| **k).count();
                if !keep_current[i] && kept_history == 0 {
                    Outcome::Remove
                } else if kept_history == r.history.len() {
                    Outcome::Keep
                } else {
                    let mut trimmed = r.clone();
                    let mut keep = keep_history[i].iter();
                    trimmed.history.retain(|_| *keep.next().expect("one flag per entry"));
                    Outcome::Trim(trimmed, r.history.len() - kept_history)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::ObjectId;
    use crate::tag::TagRef;

    /// A record for `tag` whose values were set at `times` (oldest first).
    fn record(tag: &str, times: &[u64]) -> TagRecord {
        let t = TagRef::parse(tag).unwrap();
        let mut r: Option<TagRecord> = None;
        for &at in times {
            r = Some(TagRecord::new(&t, ObjectId::of(&at.to_le_bytes()), at, r));
        }
        r.unwrap()
    }

    #[test]
    fn no_rule_keeps_everything() {
        let recs = [record("a", &[1, 2, 3])];
        assert_eq!(Policy::default().apply(&recs, 100), vec![Outcome::Keep]);
    }

    #[test]
    fn keep_last_counts_versions_and_history_per_name() {
        // a:v1 set at 10, a:v2 set at 20 and 30 (history 20), b:latest at 5.
        let recs = [record("a:v1", &[10]), record("a:v2", &[20, 30]), record("b", &[5])];
        let out = Policy { keep_last: Some(1), ..Default::default() }.apply(&recs, 100);
        assert_eq!(out[0], Outcome::Remove);
        match &out[1] {
            Outcome::Trim(r, 1) => assert!(r.history.is_empty() && r.set_unix == 30),
            other => panic!("{other:?}"),
        }
        assert_eq!(out[2], Outcome::Keep, "each name keeps its own newest");
        let out = Policy { keep_last: Some(2), ..Default::default() }.apply(&recs, 100);
        assert_eq!(out, vec![Outcome::Remove, Outcome::Keep, Outcome::Keep]);
    }

    #[test]
    fn keep_within_and_union_of_rules() {
        let recs = [record("a", &[10, 50, 90])];
        let within = Policy { keep_within_secs: Some(50), ..Default::default() };
        match &within.apply(&recs, 100)[0] {
            Outcome::Trim(r, 1) => assert_eq!(r.history.iter().map(|h| h.set_unix).collect::<Vec<_>>(), vec![50]),
            other => panic!("{other:?}"),
        }
        let both = Policy { keep_last: Some(3), keep_within_secs: Some(1) };
        assert_eq!(both.apply(&recs, 100), vec![Outcome::Keep]);
        let none_recent = Policy { keep_within_secs: Some(1), ..Default::default() };
        assert_eq!(none_recent.apply(&recs, 100), vec![Outcome::Remove]);
    }
}
