//! The fill order: a recorded profile (which memory the restored process needed first, the
//! last time this image was restored) or, without one, the largest memory areas first (they
//! hold the bulk of the data, e.g. a GPU driver's host copy of VRAM).

use serde::{Deserialize, Serialize};

/// Format version of a stored profile.
pub const PROFILE_FORMAT: u32 = 1;

/// Segments in the order a restored process first needed them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// [`PROFILE_FORMAT`].
    pub format: u32,
    /// The segment size the offsets refer to.
    pub segment_bytes: u64,
    /// (pid, offset in its pages file) of each segment, first needed first.
    pub order: Vec<(u32, u64)>,
}

impl Profile {
    /// A profile from first-need order.
    pub fn new(segment_bytes: u64, order: Vec<(u32, u64)>) -> Profile {
        Profile { format: PROFILE_FORMAT, segment_bytes, order }
    }

    /// Parses a stored profile; `None` for one of another format or segment size (it is only a
    /// hint: the fill order falls back to the default).
    pub fn parse(bytes: &[u8], segment_bytes: u64) -> Option<Profile> {
        serde_json::from_slice::<Profile>(bytes)
            .ok()
            .filter(|p| p.format == PROFILE_FORMAT && p.segment_bytes == segment_bytes)
    }

    /// The stored form.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a profile serializes")
    }
}

/// Segment indices in fill order: those `profile` names for `pid` first (in its order), then
/// the rest by area size (largest first), then address. `starts[i]` is segment `i`'s offset in
/// the pages file and `areas[i]` the size of the memory area it lies in.
pub fn fill_order(pid: u32, starts: &[u64], areas: &[u64], profile: Option<&Profile>) -> Vec<usize> {
    let mut rank = vec![usize::MAX; starts.len()];
    if let Some(p) = profile {
        for (r, &(_, off)) in p.order.iter().filter(|(p, _)| *p == pid).enumerate() {
            if let Ok(i) = starts.binary_search(&off) {
                rank[i] = rank[i].min(r);
            }
        }
    }
    let mut idx: Vec<usize> = (0..starts.len()).collect();
    idx.sort_by_key(|&i| (rank[i], std::cmp::Reverse(areas[i]), starts[i]));
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_first_then_largest_areas() {
        let starts = [0, 10, 20, 30, 40];
        let areas = [5, 100, 5, 100, 50];
        assert_eq!(fill_order(7, &starts, &areas, None), vec![1, 3, 4, 0, 2]);
        let p = Profile::new(10, vec![(7, 20), (8, 0), (7, 40), (7, 999)]);
        assert_eq!(fill_order(7, &starts, &areas, Some(&p)), vec![2, 4, 1, 3, 0]);
        let back = Profile::parse(&p.encode(), 10).expect("round trip");
        assert_eq!(back, p);
        assert!(Profile::parse(&p.encode(), 11).is_none(), "another segment size");
        assert!(Profile::parse(b"{", 10).is_none());
    }
}
