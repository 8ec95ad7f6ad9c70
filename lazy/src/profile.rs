//! The fill order: a recorded profile (which memory the restored process needed first, the
//! last time this image was restored; stored with the image, see [`Profile`]) first, then the
//! largest memory areas (they hold the bulk of the data, e.g. a GPU driver's host copy of
//! VRAM).

pub use gstore_store::format::profile::Profile;

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
    }
}
