//! Resemblance sketches: which stored chunk a new chunk is most like, so that it can be
//! stored as a delta against it (codec 4, docs/FORMAT.md).
//!
//! The sketch follows Odess (Zhang et al., 2021), over 8-byte words rather than bytes: a
//! gear-style hash rolls over the chunk's words (each word mixed by a multiply, the hash
//! shifted one bit per word, so it depends on the last 64 words), words where its low bits are
//! zero are sampled (content-defined, so an edit moves few samples), and each of [`FEATURES`]
//! linear transforms of the hash keeps its maximum over the samples. Words are taken at file
//! offsets that are multiples of 8, so content that moved by whole pages (as in a CRIU page
//! image) is seen in the same words. A chunk where a few pages changed keeps most features
//! (each depends on one sampled word); each is looked up on its own.

/// Whether `name` is the name of a CRIU page image (`pages-N.img`): process memory, which
/// changes page by page between checkpoints. A path with a directory part is not such a name.
pub fn is_page_image(name: &str) -> bool {
    name.strip_prefix("pages-")
        .and_then(|r| r.strip_suffix(".img"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether the file at `path` (`/`-separated, at any depth) is a CRIU page image.
pub fn is_page_image_path(path: &str) -> bool {
    path.rsplit('/').next().is_some_and(is_page_image)
}

/// Features per chunk.
pub const FEATURES: usize = 8;
/// Super-features per chunk (each of `FEATURES / SUPER_FEATURES` features). One feature
/// each: a chunk that a changed page split or merged with its neighbour keeps only the
/// features whose maximum fell in its part, and grouped features would all change.
pub const SUPER_FEATURES: usize = 8;
/// Words where `hash & SAMPLE_MASK == 0` are sampled: one in 16 on average (one per 128
/// bytes; one in 8 cost a push 5 % of its CPU for no better bases).
const SAMPLE_MASK: u64 = (1 << 4) - 1;
/// Fewer samples than this make no sketch: too little content to judge resemblance by.
const MIN_SAMPLES: usize = 16;

/// A chunk's super-features.
pub type Sketch = [u64; SUPER_FEATURES];

/// One step of splitmix64: the transforms' constants come from it.
const fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The transforms `h * M[i] + A[i]` (M odd: a bijection of the 64-bit hashes).
const TRANSFORMS: [(u64, u64); FEATURES] = {
    let mut t = [(0u64, 0u64); FEATURES];
    let mut i = 0;
    while i < FEATURES {
        t[i] = (splitmix(1000 + i as u64) | 1, splitmix(2000 + i as u64));
        i += 1;
    }
    t
};

/// Words read between checks of how many samples are waiting.
const BLOCK: usize = 64;
/// Samples that can wait to be taken into the features.
const SAMPLED: usize = 4 * BLOCK;

/// Takes sampled hashes into the features: each feature keeps its maximum of the samples
/// under its transform. A sample equal to the one before changes nothing (runs of one word,
/// such as zeros, sample every word with the same hash).
fn take_samples(features: &mut [u64; FEATURES], samples: &[u64]) {
    let mut last = None;
    for &h in samples {
        if last == Some(h) {
            continue;
        }
        last = Some(h);
        for (f, (m, a)) in features.iter_mut().zip(TRANSFORMS) {
            *f = (*f).max(h.wrapping_mul(m).wrapping_add(a));
        }
    }
}

/// The sketch of `data`, which starts at byte `offset` of its file, or `None` when it has
/// too few sampled words to have one (short, or of little variety).
pub fn sketch(data: &[u8], offset: u64) -> Option<Sketch> {
    let mut features = [0u64; FEATURES];
    let mut samples = 0usize;
    let mut h = 0u64;
    let skip = ((8 - offset % 8) % 8) as usize;
    // Sampled hashes are collected without a branch (which word is sampled is random: a
    // branch on it is mispredicted once a sample) and taken into the features in batches.
    let mut sampled = [0u64; SAMPLED];
    let mut n = 0;
    for block in data.get(skip..)?.chunks(8 * BLOCK) {
        for word in block.chunks_exact(8) {
            let x = u64::from_le_bytes(word.try_into().expect("8 bytes")).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h = (h << 1).wrapping_add(x ^ (x >> 29));
            sampled[n % SAMPLED] = h;
            n += usize::from(h & SAMPLE_MASK == 0);
        }
        if n > SAMPLED - BLOCK {
            take_samples(&mut features, &sampled[..n]);
            samples += n;
            n = 0;
        }
    }
    take_samples(&mut features, &sampled[..n]);
    samples += n;
    (samples >= MIN_SAMPLES).then(|| super_features(&features))
}

/// The super-features of `features`: each the first 8 bytes of the BLAKE3 hash of its group
/// of features (little-endian words).
fn super_features(features: &[u64; FEATURES]) -> Sketch {
    let per = FEATURES / SUPER_FEATURES;
    let mut out = [0u64; SUPER_FEATURES];
    for (i, sf) in out.iter_mut().enumerate() {
        let mut bytes = [0u8; 8 * FEATURES / SUPER_FEATURES];
        for (j, f) in features[i * per..(i + 1) * per].iter().enumerate() {
            bytes[j * 8..j * 8 + 8].copy_from_slice(&f.to_le_bytes());
        }
        *sf = u64::from_le_bytes(blake3::hash(&bytes).as_bytes()[..8].try_into().expect("8 bytes"));
    }
    out
}

/// The page size of CRIU page images: changes come in pages at file offsets that are
/// multiples of it.
pub const PAGE: u64 = 4096;

/// The part of chunk `plain` (at file offset `at`) that `base` does not hold when `base` lines
/// up with one end of it: past the page of the first difference from a base that starts as
/// the chunk does, or before the page of the last difference from one that ends as it does.
/// A chunk whose changed page merged two old chunks into one starts like the first and ends
/// like the second: the part a delta against one leaves over is the other, and the sketch of
/// that part finds it. `None` when `base` lines up with neither end (by a page at least) or
/// nothing is left over.
pub fn uncovered(plain: &[u8], at: u64, base: &[u8]) -> Option<std::ops::Range<usize>> {
    let same_head = same_head(plain, base);
    let same_tail = same_tail(plain, base);
    if same_head == plain.len() || same_head.max(same_tail) < PAGE as usize {
        return None;
    }
    if same_head >= same_tail {
        // From the end of the page that holds the first difference.
        let end = ((at + same_head as u64) / PAGE + 1) * PAGE - at;
        (end < plain.len() as u64).then_some(end as usize..plain.len())
    } else {
        // Up to the start of the page that holds the last difference.
        let last = at + (plain.len() - same_tail - 1) as u64;
        let start = (last / PAGE * PAGE).checked_sub(at)?;
        (start > 0).then_some(0..start as usize)
    }
}

/// True when chunk `plain` starts and ends with the same [`SAME_ENDS`] bytes as `base`: both
/// its cut points were found again, so it is `base` changed inside, where a second base
/// seldom holds what a delta against `base` leaves over (a change that moves a cut point makes
/// a chunk that spans two old ones, whose ends differ from each one's).
pub fn same_ends(plain: &[u8], base: &[u8]) -> bool {
    let n = SAME_ENDS;
    plain.len() >= n && base.len() >= n && plain[..n] == base[..n] && plain[plain.len() - n..] == base[base.len() - n..]
}

/// How many bytes at each end [`same_ends`] compares.
pub const SAME_ENDS: usize = 64;

/// How many bytes `a` and `b` share before they first differ (compared a block at a time).
fn same_head(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 64;
    let n = a.len().min(b.len());
    let mut at = 0;
    while at + BLOCK <= n && a[at..at + BLOCK] == b[at..at + BLOCK] {
        at += BLOCK;
    }
    at + a[at..n].iter().zip(&b[at..n]).take_while(|(x, y)| x == y).count()
}

/// How many bytes `a` and `b` share after they last differ (compared a block at a time).
fn same_tail(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 64;
    let n = a.len().min(b.len());
    let (a, b) = (&a[a.len() - n..], &b[b.len() - n..]);
    let mut at = n;
    while at >= BLOCK && a[at - BLOCK..at] == b[at - BLOCK..at] {
        at -= BLOCK;
    }
    n - at + a[..at].iter().rev().zip(b[..at].iter().rev()).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_base_lined_up_with_one_end_leaves_over() {
        let old_a = noise(40_000, 1);
        let old_b = noise(30_000, 2);
        // At file offset 4096 * 10 + 100: pages are not aligned with the chunk.
        let at = 41_060;
        let mut merged = [&old_a[..], &old_b[..]].concat();
        // A changed page inside old_a (file offsets 49152..53248).
        let page = (49_152 - at) as usize;
        merged[page..page + 4096].copy_from_slice(&noise(4096, 3));
        let r = uncovered(&merged, at, &old_a).unwrap();
        assert_eq!(r, page + 4096..merged.len(), "past the changed page");
        // Against a base lined up with the end from chunk byte 30000 on (the byte before
        // differs): up to the start of the page holding chunk byte 29999.
        let mut tail_base = noise(8192, 4);
        tail_base[8191] = merged[29_999] ^ 0xff;
        tail_base.extend_from_slice(&merged[30_000..]);
        let r = uncovered(&merged, at, &tail_base).unwrap();
        assert_eq!(r, 0..((at as usize + 29_999) / 4096 * 4096 - at as usize));
        // Lined up with neither end, or equal: nothing to say.
        assert_eq!(uncovered(&merged, at, &noise(70_000, 5)), None);
        assert_eq!(uncovered(&merged, at, &merged), None);
    }

    /// Pseudo-random bytes.
    fn noise(n: usize, seed: u64) -> Vec<u8> {
        (0..n as u64).map(|i| splitmix(i ^ (seed << 40)) as u8).collect()
    }

    #[test]
    fn shared_heads_and_tails_are_counted_to_the_byte() {
        let a = noise(1000, 4);
        for at in [0, 1, 63, 64, 65, 500, 999] {
            let mut b = a.clone();
            b[at] ^= 0x40;
            assert_eq!(same_head(&a, &b), at);
            assert_eq!(same_tail(&a, &b), 999 - at);
        }
        assert_eq!(same_head(&a, &a[..300]), 300);
        assert_eq!(same_tail(&a, &a[700..]), 300);
        assert_eq!(same_head(&a, &a), 1000);
        assert_eq!(same_tail(&[], &a), 0);
    }

    #[test]
    fn same_ends_tells_a_chunk_changed_inside_from_one_spanning_two() {
        let old_a = noise(40_000, 1);
        let old_b = noise(30_000, 2);
        let mut inside = old_a.clone();
        inside[20_000..24_096].copy_from_slice(&noise(4096, 3));
        assert!(same_ends(&inside, &old_a));
        let spanning = [&old_a[20_000..], &old_b[..10_000]].concat();
        assert!(!same_ends(&spanning, &old_a) && !same_ends(&spanning, &old_b));
        // A change within the last SAME_ENDS bytes counts as a different end.
        let mut tail = old_a.clone();
        tail[40_000 - SAME_ENDS] ^= 1;
        assert!(!same_ends(&tail, &old_a));
        assert!(!same_ends(&old_a[..10], &old_a[..10]), "shorter than SAME_ENDS");
    }

    #[test]
    fn a_chunk_with_a_changed_page_keeps_a_super_feature() {
        let base = noise(64 << 10, 1);
        let a = sketch(&base, 0).unwrap();
        let mut shared = 0;
        for page in 0..16 {
            let mut edited = base.clone();
            edited[page * 4096..(page + 1) * 4096].copy_from_slice(&noise(4096, 2 + page as u64));
            let b = sketch(&edited, 0).unwrap();
            shared += usize::from(a.iter().zip(&b).any(|(x, y)| x == y));
        }
        assert!(shared >= 15, "only {shared} of 16 single-page edits kept a super-feature");
        // Unrelated content shares none.
        let other = sketch(&noise(64 << 10, 99), 0).unwrap();
        // The same bytes a page further into their file have the same sketch; at an offset that
        // is not a multiple of 8 they are read as other words.
        assert_eq!(sketch(&base, 4096), Some(a));
        assert_ne!(sketch(&base, 3), Some(a));
        assert!(a.iter().zip(&other).all(|(x, y)| x != y));
    }

    /// The sketch word by word, as the module doc states it (and as stores made before
    /// samples were batched computed it).
    fn sketch_word_by_word(data: &[u8], offset: u64) -> Option<Sketch> {
        let mut features = [0u64; FEATURES];
        let (mut h, mut samples) = (0u64, 0);
        for word in data[((8 - offset % 8) % 8) as usize..].chunks_exact(8) {
            let x = u64::from_le_bytes(word.try_into().unwrap()).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h = (h << 1).wrapping_add(x ^ (x >> 29));
            if h & SAMPLE_MASK == 0 {
                samples += 1;
                for (f, (m, a)) in features.iter_mut().zip(TRANSFORMS) {
                    *f = (*f).max(h.wrapping_mul(m).wrapping_add(a));
                }
            }
        }
        (samples >= MIN_SAMPLES).then(|| super_features(&features))
    }

    #[test]
    fn batched_samples_give_the_sketch_of_sampling_word_by_word() {
        // Indexes hold sketches: the same bytes must keep the same sketch. Zero words are
        // all sampled or none (a run of them fills the batch).
        let mut data = noise(300_001, 7);
        data[100_000..180_000].fill(0);
        for (len, offset) in [(300_001, 0), (300_000, 3), (65_536, 4096), (1000, 5), (129, 0), (2047, 1), (300, 0)] {
            assert_eq!(sketch(&data[..len], offset), sketch_word_by_word(&data[..len], offset), "{len} at {offset}");
        }
        let words = |n: usize| (0..n as u64).flat_map(|i| splitmix(i).to_le_bytes()).collect::<Vec<u8>>();
        for n in [BLOCK - 1, BLOCK, SAMPLED + 1, 40 * SAMPLED] {
            assert_eq!(sketch(&words(n), 0), sketch_word_by_word(&words(n), 0), "{n} words");
        }
        assert!(sketch(&data, 0).is_some() && sketch(&data[..300], 0).is_none());
    }

    #[test]
    fn too_little_content_has_no_sketch() {
        assert!(sketch(&noise(100, 3), 0).is_none());
    }
}
