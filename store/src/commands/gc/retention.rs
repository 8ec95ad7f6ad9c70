//! Retention: which images of each tag name `gstore gc --keep-last N --keep-within DUR
//! --keep-daily N --keep-weekly N [--prefix P]` keeps.
//!
//! An image of a tag name is the current value or a history entry of any of its versions,
//! dated by when it was made: its manifest's creation time (`created_unix`, which
//! `SOURCE_DATE_EPOCH` sets), the same date `ls --latest` and `latest()` go by. Equal
//! creation times (whole seconds) rank by when each was set, to the nanosecond (records of
//! older versions have whole seconds: they count as set at the start of theirs), then by each
//! record's own order: its current value before its history, history newest first. An image
//! whose manifest cannot be read is dated by when it was set. Within one name, images are
//! ranked newest first. One is kept if its rank is below `keep_last`, it was made within
//! `keep_within` of now, or it is the newest of its UTC day (Monday-to-Sunday UTC week) and
//! that day (week) is among the newest `keep_daily` (`keep_weekly`) days (weeks) that have
//! images of the name. With no rule, everything is kept. Names outside `prefix` (when given)
//! are left alone, and so is the current image of a pinned tag (`gstore pin`). A tag record
//! is removed only when none of its images is kept; otherwise its history is trimmed to the
//! kept entries.

use crate::error::{Result, StoreError};
use crate::format::tag::{SetTime, TagRecord};
use std::collections::BTreeMap;

/// The retention rules (all optional; an image kept by any rule is kept). Stored in
/// `policies.json` without `prefix` (docs/FORMAT.md); an unknown rule there is refused, never
/// ignored: ignoring a rule could remove what it keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Keep the newest N images of each tag name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<usize>,
    /// Keep the images set within this many seconds of now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_within_secs: Option<u64>,
    /// Keep the newest image of each of the newest N UTC days that have images of the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_daily: Option<usize>,
    /// Keep the newest image of each of the newest N UTC weeks (Monday to Sunday) that have
    /// images of the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_weekly: Option<usize>,
    /// Apply the rules only to tag names that start with this; others keep everything.
    #[serde(skip)]
    pub prefix: Option<String>,
}

/// Seconds in a day.
const DAY: u64 = 86_400;

/// The UTC day a time is in.
fn day(unix: u64) -> u64 {
    unix / DAY
}

/// The UTC week (Monday to Sunday) a time is in: 1970-01-01 was a Thursday.
fn week(unix: u64) -> u64 {
    (unix / DAY + 3) / 7
}

/// One image of a tag name, as retention ranks it.
struct Item {
    /// When the image was made (else when it was set), in Unix seconds.
    made: u64,
    /// When it was set.
    set: SetTime,
    /// The record's current value (else a history entry).
    current: bool,
    /// Index of the record.
    record: usize,
    /// Index in the record's history.
    entry: usize,
}

/// Flags, in `items`' order (newest first), the newest image of each of the newest `n`
/// periods that have images.
fn newest_per_period(items: &[Item], n: usize, period: fn(u64) -> u64) -> Vec<bool> {
    let mut seen = Vec::new();
    items
        .iter()
        .map(|item| {
            let p = period(item.made);
            if seen.len() < n && !seen.contains(&p) {
                seen.push(p);
                true
            } else {
                false
            }
        })
        .collect()
}

/// What retention decided for one image of a name the rules cover, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Verdict {
    /// The tag (`NAME:VERSION`) whose current value or history entry the image is.
    pub tag: String,
    /// Whether it is the tag's current value (else a history entry).
    pub current: bool,
    /// The image's manifest id (hex).
    pub manifest: String,
    /// When it was made (else set), in Unix seconds: what retention dates it by.
    pub made_unix: u64,
    /// Its rank among the name's images, 1 the newest.
    pub rank: usize,
    /// Whether it is kept.
    pub kept: bool,
    /// Why: the rules that keep it, or why none does.
    pub why: String,
    /// The stored policy that decided (its pattern); `None`: the command line's rules.
    pub policy: Option<String>,
}

/// The UTC date of a Unix time, `YYYY-MM-DD`.
fn date(unix: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix);
    humantime::format_rfc3339_seconds(t).to_string()[..10].to_string()
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
        self.keep_last.is_none()
            && self.keep_within_secs.is_none()
            && self.keep_daily.is_none()
            && self.keep_weekly.is_none()
    }

    /// Refuses rules that would keep nothing by themselves, or a prefix with no rule to limit
    /// (the command line and the Python package both come through here).
    pub fn check(&self) -> Result<()> {
        let refuse = |why: &str| Err(StoreError::Refused(why.to_string()));
        if self.keep_last == Some(0) || self.keep_within_secs == Some(0) {
            return refuse("keep-last 0 and keep-within 0 would remove every image of a name: remove tags with rm");
        }
        if self.keep_daily == Some(0) || self.keep_weekly == Some(0) {
            return refuse("keep-daily and keep-weekly 0 keep nothing by their rule: leave them out");
        }
        if self.prefix.is_some() && self.is_none() {
            return refuse(
                "a prefix limits retention rules to the names it starts: give keep-last, keep-within, keep-daily or keep-weekly too",
            );
        }
        Ok(())
    }

    /// Whether the rules apply to tag name `name` (it starts with the prefix, if one is given).
    pub fn covers(&self, name: &str) -> bool {
        self.prefix.as_deref().is_none_or(|p| name.starts_with(p))
    }

    /// The images (manifest ids, hex, each once) whose creation times [`Policy::apply`] asks
    /// for: those of the names the rules cover; none when no rule is set.
    pub fn dated<'r>(&self, records: &'r [TagRecord]) -> Vec<&'r str> {
        if self.is_none() {
            return Vec::new();
        }
        let ids: std::collections::BTreeSet<&str> = records
            .iter()
            .filter(|r| self.covers(&r.name))
            .flat_map(|r| std::iter::once(r.manifest.as_str()).chain(r.history.iter().map(|h| h.manifest.as_str())))
            .collect();
        ids.into_iter().collect()
    }

    /// The outcome for each of `records` (same order), at time `now`; `made` gives the
    /// creation time of an image by its manifest id (hex), `None` when it cannot be read.
    pub fn apply(&self, records: &[TagRecord], now: u64, made: &dyn Fn(&str) -> Option<u64>) -> Vec<Outcome> {
        self.decide(records, now, made).0
    }

    /// [`Policy::apply`]'s outcomes, and the verdict on every image of the names the rules
    /// cover (by name, newest first): kept or not, and why.
    pub fn decide(
        &self,
        records: &[TagRecord],
        now: u64,
        made: &dyn Fn(&str) -> Option<u64>,
    ) -> (Vec<Outcome>, Vec<Verdict>) {
        if self.is_none() {
            return (vec![Outcome::Keep; records.len()], Vec::new());
        }
        let mut verdicts = Vec::new();
        let mut by_name: BTreeMap<&str, Vec<Item>> = BTreeMap::new();
        let mut keep_current = vec![false; records.len()];
        for (i, r) in records.iter().enumerate() {
            if !self.covers(&r.name) {
                continue;
            }
            keep_current[i] = r.pinned;
            let item = |manifest: &str, set: SetTime, current, entry| Item {
                made: made(manifest).unwrap_or(set.unix),
                set,
                current,
                record: i,
                entry,
            };
            let items = by_name.entry(&r.name).or_default();
            items.push(item(&r.manifest, r.set_time(), true, 0));
            items.extend(r.history.iter().enumerate().map(|(j, h)| item(&h.manifest, h.set_time(), false, j)));
        }
        let mut keep_history: Vec<Vec<bool>> = records.iter().map(|r| vec![false; r.history.len()]).collect();
        for items in by_name.values_mut() {
            items.sort_by(|a, b| {
                (b.made, b.set, b.current)
                    .cmp(&(a.made, a.set, a.current))
                    .then((a.record, a.entry).cmp(&(b.record, b.entry)))
            });
            let daily = newest_per_period(items, self.keep_daily.unwrap_or(0), day);
            let weekly = newest_per_period(items, self.keep_weekly.unwrap_or(0), week);
            for (rank, item) in items.iter().enumerate() {
                let r = &records[item.record];
                let pinned = item.current && r.pinned;
                let mut why = Vec::new();
                if pinned {
                    why.push("pinned".to_string());
                }
                if let Some(n) = self.keep_last.filter(|n| rank < *n) {
                    why.push(format!("one of the newest {n}"));
                }
                if let Some(w) = self.keep_within_secs.filter(|w| now.saturating_sub(item.made) <= *w) {
                    why.push(format!("made within {}", humantime::format_duration(std::time::Duration::from_secs(w))));
                }
                if daily[rank] {
                    why.push(format!("the newest of {} (UTC)", date(item.made)));
                }
                if weekly[rank] {
                    why.push(format!("the newest of its week (Monday to Sunday, UTC; made {})", date(item.made)));
                }
                let kept = !why.is_empty();
                if kept && item.current {
                    keep_current[item.record] = true;
                } else if kept {
                    keep_history[item.record][item.entry] = true;
                }
                let manifest = if item.current { &r.manifest } else { &r.history[item.entry].manifest };
                verdicts.push(Verdict {
                    tag: r.tag().to_string(),
                    current: item.current,
                    manifest: manifest.clone(),
                    made_unix: item.made,
                    rank: rank + 1,
                    kept,
                    why: if kept {
                        why.join("; ")
                    } else {
                        format!(
                            "made {}, the {} newest of {}: no rule keeps it",
                            date(item.made),
                            ordinal(rank + 1),
                            r.name
                        )
                    },
                    policy: None,
                });
            }
        }
        let outcomes = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if !self.covers(&r.name) {
                    return Outcome::Keep;
                }
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
            .collect();
        (outcomes, verdicts)
    }
}

/// `1st`, `2nd`, `3rd`, `4th`, ... `11th`, `21st`.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::id::ObjectId;
    use crate::format::tag::TagRef;

    /// No image's creation time is known: images are dated by when they were set.
    fn unknown(_: &str) -> Option<u64> {
        None
    }

    #[test]
    fn rules_that_keep_nothing_and_a_prefix_alone_are_refused() {
        let refused = |p: Policy| p.check().unwrap_err().to_string();
        assert!(refused(Policy { keep_last: Some(0), ..Default::default() }).contains("would remove every image"));
        assert!(refused(Policy { keep_within_secs: Some(0), ..Default::default() }).contains("keep-within 0"));
        assert!(refused(Policy { keep_weekly: Some(0), ..Default::default() }).contains("keep nothing"));
        let prefix = || Some("run-a".to_string());
        assert!(refused(Policy { prefix: prefix(), ..Default::default() }).contains("a prefix limits"));
        assert!(Policy { prefix: prefix(), keep_daily: Some(2), ..Default::default() }.check().is_ok());
        assert!(Policy::default().check().is_ok(), "no rule: gc reclaims what no tag keeps");
    }

    /// A record for `tag` whose values were set at `times` (oldest first, whole seconds).
    fn record(tag: &str, times: &[u64]) -> TagRecord {
        let times: Vec<SetTime> = times.iter().map(|&unix| SetTime { unix, nanos: 0 }).collect();
        record_at(tag, &times)
    }

    /// A record for `tag` whose values, each another image, were set at `times` (oldest first).
    fn record_at(tag: &str, times: &[SetTime]) -> TagRecord {
        let t = TagRef::parse(tag).unwrap();
        let mut r: Option<TagRecord> = None;
        for (i, &at) in times.iter().enumerate() {
            let id =
                ObjectId::of(&[tag.as_bytes(), &at.unix.to_le_bytes(), &at.nanos.to_le_bytes(), &[i as u8]].concat());
            r = Some(TagRecord::new(&t, id, at, r));
        }
        r.unwrap()
    }

    /// Drops the nanoseconds, as a record written by an older version has none.
    fn without_nanos(mut r: TagRecord) -> TagRecord {
        r.set_nanos = 0;
        for h in &mut r.history {
            h.set_nanos = 0;
        }
        r
    }

    #[test]
    fn pushes_within_one_second_rank_by_their_nanoseconds() {
        // fast:v1 .. fast:v6 set in the same second, in that order; records list v1 first.
        let recs: Vec<TagRecord> =
            (1..=6u32).map(|i| record_at(&format!("fast:v{i}"), &[SetTime { unix: 100, nanos: i * 1000 }])).collect();
        let out = Policy { keep_last: Some(2), ..Default::default() }.apply(&recs, 100, &unknown);
        let kept: Vec<&str> =
            recs.iter().zip(&out).filter(|(_, o)| **o != Outcome::Remove).map(|(r, _)| r.version.as_str()).collect();
        assert_eq!(kept, ["v5", "v6"]);
    }

    #[test]
    fn older_records_without_nanoseconds_rank_by_their_own_order() {
        // One tag moved three times within a second by an older version: history order says
        // which is newest.
        let moved = without_nanos(record("a", &[100, 100, 100]));
        let out =
            Policy { keep_last: Some(1), ..Default::default() }.apply(std::slice::from_ref(&moved), 100, &unknown);
        match &out[0] {
            Outcome::Trim(r, 2) => assert_eq!(r.manifest, moved.manifest),
            other => panic!("{other:?}"),
        }
        // A value set later in the same second by this version ranks before the older record's.
        let old = without_nanos(record("b:old", &[100]));
        let new = record_at("b:new", &[SetTime { unix: 100, nanos: 1 }]);
        let out = Policy { keep_last: Some(1), ..Default::default() }.apply(&[new, old], 100, &unknown);
        assert_eq!(out, vec![Outcome::Keep, Outcome::Remove]);
    }

    #[test]
    fn every_image_of_a_covered_name_gets_a_verdict_that_says_why() {
        // a:latest made on three days (the newest first in rank), pinned; b is outside the prefix.
        let mut a = record("a", &[DAY + 5, 2 * DAY + 5, 3 * DAY + 5]);
        a.pinned = true;
        let recs = [a, record("b", &[1])];
        let p = Policy { keep_last: Some(1), keep_daily: Some(2), prefix: Some("a".into()), ..Default::default() };
        let (outcomes, verdicts) = p.decide(&recs, 3 * DAY + 10, &unknown);
        assert_eq!(outcomes, p.apply(&recs, 3 * DAY + 10, &unknown), "decide and apply agree");
        let why: Vec<(usize, bool, &str)> = verdicts.iter().map(|v| (v.rank, v.kept, v.why.as_str())).collect();
        assert_eq!(
            why,
            [
                (1, true, "pinned; one of the newest 1; the newest of 1970-01-04 (UTC)"),
                (2, true, "the newest of 1970-01-03 (UTC)"),
                (3, false, "made 1970-01-02, the 3rd newest of a: no rule keeps it"),
            ]
        );
        assert!(verdicts.iter().all(|v| v.tag == "a:latest"), "b is outside the prefix: no verdict");
        assert!(verdicts[0].current && !verdicts[2].current);
        assert_eq!(Policy::default().decide(&recs, 0, &unknown).1, [], "no rule: no verdicts");
    }

    #[test]
    fn no_rule_keeps_everything() {
        let recs = [record("a", &[1, 2, 3])];
        assert_eq!(Policy::default().apply(&recs, 100, &unknown), vec![Outcome::Keep]);
    }

    #[test]
    fn keep_last_counts_versions_and_history_per_name() {
        // a:v1 set at 10, a:v2 set at 20 and 30 (history 20), b:latest at 5.
        let recs = [record("a:v1", &[10]), record("a:v2", &[20, 30]), record("b", &[5])];
        let out = Policy { keep_last: Some(1), ..Default::default() }.apply(&recs, 100, &unknown);
        assert_eq!(out[0], Outcome::Remove);
        match &out[1] {
            Outcome::Trim(r, 1) => assert!(r.history.is_empty() && r.set_unix == 30),
            other => panic!("{other:?}"),
        }
        assert_eq!(out[2], Outcome::Keep, "each name keeps its own newest");
        let out = Policy { keep_last: Some(2), ..Default::default() }.apply(&recs, 100, &unknown);
        assert_eq!(out, vec![Outcome::Remove, Outcome::Keep, Outcome::Keep]);
    }

    #[test]
    fn keep_within_and_union_of_rules() {
        let recs = [record("a", &[10, 50, 90])];
        let within = Policy { keep_within_secs: Some(50), ..Default::default() };
        match &within.apply(&recs, 100, &unknown)[0] {
            Outcome::Trim(r, 1) => assert_eq!(r.history.iter().map(|h| h.set_unix).collect::<Vec<_>>(), vec![50]),
            other => panic!("{other:?}"),
        }
        let both = Policy { keep_last: Some(3), keep_within_secs: Some(1), ..Default::default() };
        assert_eq!(both.apply(&recs, 100, &unknown), vec![Outcome::Keep]);
        let none_recent = Policy { keep_within_secs: Some(1), ..Default::default() };
        assert_eq!(none_recent.apply(&recs, 100, &unknown), vec![Outcome::Remove]);
    }

    #[test]
    fn daily_and_weekly_keep_the_newest_of_each_period() {
        // Images at 01:00 and 23:00 of days 0..10 (1970-01-01 is a Thursday).
        let times: Vec<u64> = (0..10).flat_map(|d| [d * DAY + 3600, d * DAY + 23 * 3600]).collect();
        let recs = [record("run", &times)];
        let now = 10 * DAY;
        let kept = |p: Policy| -> Vec<u64> {
            match &p.apply(&recs, now, &unknown)[0] {
                Outcome::Trim(r, _) => {
                    std::iter::once(r.set_unix).chain(r.history.iter().map(|h| h.set_unix)).collect()
                }
                other => panic!("{other:?}"),
            }
        };
        let daily = kept(Policy { keep_daily: Some(3), ..Default::default() });
        assert_eq!(
            daily,
            [9 * DAY + 23 * 3600, 8 * DAY + 23 * 3600, 7 * DAY + 23 * 3600],
            "the last of each of 3 days"
        );
        // Weeks: days 0-3 (Thu-Sun) are one week, days 4-10 (Mon-...) the next.
        let weekly = kept(Policy { keep_weekly: Some(2), ..Default::default() });
        assert_eq!(weekly, [9 * DAY + 23 * 3600, 3 * DAY + 23 * 3600]);
        let both = kept(Policy { keep_last: Some(1), keep_weekly: Some(2), ..Default::default() });
        assert_eq!(both, weekly, "the union: the newest is also the newest of its week");
    }

    #[test]
    fn pinned_tags_and_names_outside_the_prefix_are_left_alone() {
        let mut pinned = record("base:v1", &[10]);
        pinned.pinned = true;
        let recs = [pinned, record("base:v2", &[20]), record("base:v3", &[30]), record("other", &[1, 2, 3])];
        let p = Policy { keep_last: Some(1), prefix: Some("base".into()), ..Default::default() };
        assert_eq!(p.apply(&recs, 100, &unknown), vec![Outcome::Keep, Outcome::Remove, Outcome::Keep, Outcome::Keep]);
        // A pinned tag's history is trimmed like any other; its current image stays.
        let mut moved = record("m", &[10, 20, 30]);
        moved.pinned = true;
        let newer = record("m:v2", &[40]);
        let trimmed = Policy { keep_last: Some(1), ..Default::default() }.apply(&[moved, newer], 100, &unknown);
        match &trimmed[0] {
            Outcome::Trim(r, 2) => assert_eq!(r.set_unix, 30),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn images_rank_by_when_they_were_made_not_when_they_were_tagged() {
        // step-10 made after step-9, but tagged first (in the same second).
        let ten = record_at("x:step-10", &[SetTime { unix: 500, nanos: 1 }]);
        let nine = record_at("x:step-9", &[SetTime { unix: 500, nanos: 2 }]);
        let made = |m: &str| Some(if m == ten.manifest { 300 } else { 200 });
        let out = Policy { keep_last: Some(1), ..Default::default() }.apply(&[ten.clone(), nine.clone()], 500, &made);
        assert_eq!(out, vec![Outcome::Keep, Outcome::Remove]);
        // Twelve images made over six days, all pushed today: keep-daily 6 keeps one a day.
        let day_of = |i: u64| 10 * DAY + (i / 2) * DAY + (i % 2) * 3600;
        let recs: Vec<TagRecord> = (0..12u64).map(|i| record(&format!("d:v{i}"), &[20 * DAY + i])).collect();
        let by_manifest: std::collections::HashMap<String, u64> =
            recs.iter().enumerate().map(|(i, r)| (r.manifest.clone(), day_of(i as u64))).collect();
        let out = Policy { keep_daily: Some(6), ..Default::default() }
            .apply(&recs, 20 * DAY + 20, &|m| by_manifest.get(m).copied());
        let kept: Vec<usize> = out.iter().enumerate().filter(|(_, o)| **o == Outcome::Keep).map(|(i, _)| i).collect();
        assert_eq!(kept, [1, 3, 5, 7, 9, 11], "the newest image of each of the six days");
    }
}
