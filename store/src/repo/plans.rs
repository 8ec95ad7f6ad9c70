//! Recorded plans: where every chunk of an image was found when a restore last planned it,
//! one file per image under the index's directory of plans (`index.plans/`, beside the index),
//! named by the hex of the plan's key (which names the image's chunk list). They are read
//! without opening the index, so a load of an image planned before starts on its reads at once,
//! and a load that only reads may open the index read-only. A plan is a cache like the index:
//! its packs are checked before it is used ([`crate::repo::index::Index::plan`]), every plan
//! goes when a pack is removed or the damaged copies change, and one that cannot be read or
//! written is looked up again.

use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::repo::chunk_location::ChunkLocation;
use std::path::{Path, PathBuf};

/// The directory of recorded plans of one index.
pub(crate) struct PlanFiles {
    dir: PathBuf,
}

impl PlanFiles {
    /// The plans of the index at `index_dir`: the directory `<index_dir>.plans`.
    pub(crate) fn of(index_dir: &Path) -> PlanFiles {
        PlanFiles { dir: index_dir.with_extension("plans") }
    }

    fn file(&self, key: &ObjectId) -> PathBuf {
        self.dir.join(key.to_hex())
    }

    /// The plan recorded under `key`, framing checked; none if there is none or it cannot be
    /// read or is damaged.
    pub(crate) fn get(&self, key: &ObjectId) -> Option<RecordedPlan> {
        RecordedPlan::parse(std::fs::read(self.file(key)).ok()?)
    }

    /// Records `record` under `key`, replacing what was there (written aside, then renamed).
    pub(crate) fn put(&self, key: &ObjectId, record: PlanRecord) -> Result<()> {
        let io = |what: &'static str, path: &Path, e| StoreError::io(what, path, e);
        std::fs::create_dir_all(&self.dir).map_err(|e| io("creating", &self.dir, e))?;
        let path = self.file(key);
        let aside = path.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&aside, record.finish()).map_err(|e| io("writing", &aside, e))?;
        std::fs::rename(&aside, &path).map_err(|e| {
            let _ = std::fs::remove_file(&aside);
            io("renaming", &path, e)
        })
    }

    /// Removes every recorded plan (a pack they may name is gone, or a copy is now known
    /// damaged); the next plan of each image looks its chunks up again.
    pub(crate) fn forget_all(&self) -> Result<()> {
        match std::fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StoreError::io("removing", &self.dir, e)),
            _ => Ok(()),
        }
    }
}

/// A plan's record, built one location at a time: the packs named (32
/// bytes each, after their count, u32 LE), then the count of locations (u32 LE) and each as
/// its pack's number (u32 LE), its value's length (u8) and its chunk entry value.
#[derive(Default)]
pub struct PlanRecord {
    packs: Vec<ObjectId>,
    numbers: std::collections::HashMap<ObjectId, u32>,
    body: Vec<u8>,
    count: u32,
}

impl PlanRecord {
    /// Appends the next location.
    pub fn push(&mut self, loc: &ChunkLocation) {
        let next = self.packs.len() as u32;
        let n = *self.numbers.entry(loc.pack).or_insert_with(|| next);
        if n == next {
            self.packs.push(loc.pack);
        }
        let v = loc.encode_value();
        self.body.extend_from_slice(&n.to_le_bytes());
        self.body.push(v.len() as u8);
        self.body.extend_from_slice(&v);
        self.count += 1;
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 32 * self.packs.len() + self.body.len());
        out.extend_from_slice(&(self.packs.len() as u32).to_le_bytes());
        for p in &self.packs {
            out.extend_from_slice(&p.0);
        }
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.body);
        out
    }
}

/// A recorded plan, read back: its framing checked, its locations decoded
/// one by one as they are taken (a large model's plan holds hundreds of thousands), each
/// `None` where its value does not decode.
pub struct RecordedPlan {
    value: Vec<u8>,
    packs: Vec<ObjectId>,
    /// Where the next location starts.
    at: usize,
    left: usize,
}

impl RecordedPlan {
    /// Checks the framing of a recorded value: the pack list, and every location's pack
    /// number and length within it, with nothing behind the last.
    pub(crate) fn parse(value: Vec<u8>) -> Option<RecordedPlan> {
        let v = &value;
        let u32_at = |at: usize| Some(u32::from_le_bytes(v.get(at..at + 4)?.try_into().ok()?) as usize);
        let np = u32_at(0)?;
        let packs: Vec<ObjectId> = v
            .get(4..4usize.checked_add(np.checked_mul(32)?)?)?
            .chunks_exact(32)
            .map(ObjectId::from_slice)
            .collect::<Option<_>>()?;
        let first = 4 + 32 * np + 4;
        let count = u32_at(first - 4)?;
        let mut at = first;
        for _ in 0..count {
            if u32_at(at)? >= packs.len() {
                return None;
            }
            at += 5 + *v.get(at + 4)? as usize;
        }
        (at == v.len()).then_some(RecordedPlan { value, packs, at: first, left: count })
    }

    /// The packs it names.
    pub(crate) fn packs(&self) -> &[ObjectId] {
        &self.packs
    }

    /// The locations it holds.
    pub fn len(&self) -> usize {
        self.left
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }
}

impl Iterator for RecordedPlan {
    type Item = Option<ChunkLocation>;

    fn next(&mut self) -> Option<Option<ChunkLocation>> {
        if self.left == 0 {
            return None;
        }
        let v = &self.value;
        // The framing was checked when the plan was read.
        let pack = &self.packs[u32::from_le_bytes(v[self.at..self.at + 4].try_into().expect("four bytes")) as usize];
        let len = v[self.at + 4] as usize;
        let mut key = [0u8; 64];
        key[32..].copy_from_slice(&pack.0);
        let loc = ChunkLocation::decode(&key, &v[self.at + 5..self.at + 5 + len]);
        self.at += 5 + len;
        self.left -= 1;
        Some(loc)
    }
}
