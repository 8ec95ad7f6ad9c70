//! Which GPU of this machine each GPU of an image is restored onto.
//!
//! The rule, for each GPU the image records, in the image's order:
//! 1. a GPU named for it in `--gpu-map OLD=NEW` (by index or UUID on either side);
//! 2. else the GPU with the same UUID, if this machine has it and it is still free;
//! 3. else (an image from before UUIDs were recorded) the GPU at the same index;
//! 4. else the free GPU with the lowest index that is the same model with at least as much
//!    memory.
//!
//! CUDA restores only onto the same chip type with enough memory, so a GPU named in the map
//! must be one too. With a map, only the GPUs it names are restored (the image lists every
//! GPU its capturer could see, which may be more than the process used); without one, every
//! recorded GPU must find a place. Anything that cannot be placed is refused with the reason,
//! before anything runs.

use crate::cuda::ffi::{CuUuid, GpuPair};
use crate::cuda::{parse_uuid, GpuInfo};

/// A GPU named in a map: by index (the image's list on the left, this machine's ordinals on
/// the right) or by UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuRef {
    /// A device index.
    Index(u32),
    /// A GPU UUID.
    Uuid([u8; 16]),
}

impl GpuRef {
    fn parse(text: &str) -> Result<GpuRef, String> {
        let text = text.trim();
        if let Ok(index) = text.parse::<u32>() {
            return Ok(GpuRef::Index(index));
        }
        parse_uuid(text).map(GpuRef::Uuid).ok_or_else(|| {
            format!("{text:?} is neither a GPU index nor a UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
        })
    }

    /// The GPU of `gpus` this names.
    fn find<'a>(&self, gpus: &'a [GpuInfo]) -> Option<&'a GpuInfo> {
        match self {
            GpuRef::Index(i) => gpus.iter().find(|g| g.index == *i),
            GpuRef::Uuid(u) => gpus.iter().find(|g| uuid_of(g) == Some(*u)),
        }
    }
}

impl std::fmt::Display for GpuRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuRef::Index(i) => write!(f, "{i}"),
            GpuRef::Uuid(u) => f.write_str(&crate::cuda::format_uuid(u)),
        }
    }
}

/// `--gpu-map OLD=NEW,...`: where named GPUs of an image go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuMap {
    /// (image GPU, GPU here) pairs, as given.
    pub entries: Vec<(GpuRef, GpuRef)>,
}

impl GpuMap {
    /// Parses `OLD=NEW[,OLD=NEW...]`, each side an index or a UUID.
    pub fn parse(text: &str) -> Result<GpuMap, String> {
        let mut entries = Vec::new();
        for item in text.split(',').filter(|s| !s.trim().is_empty()) {
            let (old, new) =
                item.split_once('=').ok_or_else(|| format!("{item:?} is not OLD=NEW (e.g. 0=1 or GPU-…=GPU-…)"))?;
            entries.push((GpuRef::parse(old)?, GpuRef::parse(new)?));
        }
        if entries.is_empty() {
            return Err("empty: expected OLD=NEW[,OLD=NEW...]".to_string());
        }
        Ok(GpuMap { entries })
    }
}

/// One image GPU and the GPU here it is restored onto.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The GPU as the image records it.
    pub from: GpuInfo,
    /// The GPU of this machine.
    pub to: GpuInfo,
}

/// Places the image's GPUs on this machine's (`here`) by the rule in the module doc; `map`
/// may be empty. Returns the placements in the image's order, or why they cannot be made.
pub fn place(image: &[GpuInfo], here: &[GpuInfo], map: &GpuMap) -> Result<Vec<Placement>, String> {
    let mut placed: Vec<Placement> = Vec::new();
    for (old, new) in &map.entries {
        let from = old
            .find(image)
            .ok_or_else(|| format!("--gpu-map names image GPU {old}, but the image records {}", list(image)))?;
        let to =
            new.find(here).ok_or_else(|| format!("--gpu-map names GPU {new}, but this machine has {}", list(here)))?;
        if placed.iter().any(|p| p.from.index == from.index) {
            return Err(format!("--gpu-map places image GPU {old} twice"));
        }
        if placed.iter().any(|p| p.to.index == to.index) {
            return Err(format!("--gpu-map places two image GPUs on GPU {new}"));
        }
        fits(from, to)?;
        placed.push(Placement { from: from.clone(), to: to.clone() });
    }
    if !map.entries.is_empty() {
        return Ok(placed);
    }
    for from in image {
        let free = |g: &&GpuInfo| !placed.iter().any(|p| p.to.index == g.index);
        let same = |g: &&GpuInfo| match (&from.uuid, &g.uuid) {
            (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
            (None, _) => g.index == from.index && fits(from, g).is_ok(),
            _ => false,
        };
        let to = here
            .iter()
            .filter(free)
            .find(same)
            .or_else(|| here.iter().filter(free).find(|g| fits(from, g).is_ok()))
            .ok_or_else(|| {
                format!(
                    "image GPU {} ({}) has no free GPU of the same model with enough memory here; this machine \
                     has {} (--gpu-map OLD=NEW places GPUs by hand; check CUDA_VISIBLE_DEVICES)",
                    from.index,
                    describe(from),
                    list(here)
                )
            })?
            .clone();
        placed.push(Placement { from: from.clone(), to });
    }
    Ok(placed)
}

/// The GPU pairs to pass to `cuCheckpointProcessRestore` for `placements`: none when every GPU
/// goes back where it was (same UUID, or the same index for an image without UUIDs), which
/// every driver accepts; otherwise one per placement, which needs a driver for CUDA 13.0 or
/// later (`driver`) and UUIDs on both sides.
pub fn pairs(placements: &[Placement], driver: (u32, u32)) -> Result<Vec<GpuPair>, String> {
    let same_uuid = placements.iter().all(|p| uuid_of(&p.from).is_some() && uuid_of(&p.from) == uuid_of(&p.to));
    let same_index = placements.iter().all(|p| p.from.uuid.is_none() && p.from.index == p.to.index);
    if same_uuid || same_index {
        return Ok(Vec::new());
    }
    if driver < (13, 0) {
        return Err(format!(
            "restoring onto other GPUs needs a driver for CUDA 13.0 or later (580+); this one supports CUDA {}.{}",
            driver.0, driver.1
        ));
    }
    placements
        .iter()
        .map(|p| match (uuid_of(&p.from), uuid_of(&p.to)) {
            (Some(old), Some(new)) => Ok(GpuPair { old: CuUuid { bytes: old }, new: CuUuid { bytes: new } }),
            (None, _) => Err(format!(
                "the image records no UUID for GPU {} (captured by an older gstore), so it can only be restored \
                 onto the GPU at the same index",
                p.from.index
            )),
            (_, None) => Err(format!("the driver reported no UUID for GPU {}", p.to.index)),
        })
        .collect()
}

/// Ok when `to` can take what ran on `from`: the same model, at least as much memory.
fn fits(from: &GpuInfo, to: &GpuInfo) -> Result<(), String> {
    if from.name != to.name {
        return Err(format!(
            "GPU {} is a {}, but image GPU {} was a {}; CUDA restores only onto the same GPU model",
            to.index, to.name, from.index, from.name
        ));
    }
    if to.total_mem_bytes < from.total_mem_bytes {
        return Err(format!(
            "GPU {} has {} bytes of memory, image GPU {} had {}",
            to.index, to.total_mem_bytes, from.index, from.total_mem_bytes
        ));
    }
    Ok(())
}

fn uuid_of(g: &GpuInfo) -> Option<[u8; 16]> {
    g.uuid.as_deref().and_then(parse_uuid)
}

fn describe(g: &GpuInfo) -> String {
    format!(
        "{}, {} bytes{}",
        g.name,
        g.total_mem_bytes,
        g.uuid.as_deref().map(|u| format!(", {u}")).unwrap_or_default()
    )
}

fn list(gpus: &[GpuInfo]) -> String {
    if gpus.is_empty() {
        return "no GPUs".to_string();
    }
    gpus.iter().map(|g| format!("{}: {}", g.index, describe(g))).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::format_uuid;

    fn gpu(index: u32, name: &str, machine: u8) -> GpuInfo {
        let mut u = [0u8; 16];
        u[0] = machine;
        u[15] = index as u8;
        GpuInfo { index, name: name.into(), total_mem_bytes: 80 << 30, uuid: Some(format_uuid(&u)) }
    }

    fn machine(id: u8, names: &[&str]) -> Vec<GpuInfo> {
        names.iter().enumerate().map(|(i, n)| gpu(i as u32, n, id)).collect()
    }

    fn indices(p: &[Placement]) -> Vec<(u32, u32)> {
        p.iter().map(|p| (p.from.index, p.to.index)).collect()
    }

    #[test]
    fn maps_parse_by_index_and_uuid_and_bad_ones_say_why() {
        let u = format_uuid(&[0xab; 16]);
        let m = GpuMap::parse(&format!("0=1, {u}=0")).unwrap();
        assert_eq!(m.entries, vec![(GpuRef::Index(0), GpuRef::Index(1)), (GpuRef::Uuid([0xab; 16]), GpuRef::Index(0))]);
        assert_eq!(
            GpuMap::parse(&u.to_uppercase().replace("GPU-", "")).unwrap_err(),
            "\"ABABABAB-ABAB-ABAB-ABAB-ABABABABABAB\" is not OLD=NEW (e.g. 0=1 or GPU-…=GPU-…)"
        );
        assert!(GpuMap::parse("0=x").unwrap_err().contains("neither a GPU index nor a UUID"));
        assert!(GpuMap::parse("").unwrap_err().contains("empty"));
        assert!(GpuMap::parse("GPU-12=0").is_err());
    }

    #[test]
    fn the_same_machine_places_every_gpu_where_it_was_without_pairs() {
        let here = machine(1, &["H200", "H200"]);
        let p = place(&here, &here, &GpuMap::default()).unwrap();
        assert_eq!(indices(&p), [(0, 0), (1, 1)]);
        assert!(pairs(&p, (13, 0)).unwrap().is_empty());
        assert!(pairs(&p, (12, 8)).unwrap().is_empty(), "an old driver restores onto the same GPUs");
    }

    #[test]
    fn uuids_are_followed_when_the_order_changed() {
        let image = machine(1, &["H200", "H200"]);
        let here = vec![GpuInfo { index: 0, ..image[1].clone() }, GpuInfo { index: 1, ..image[0].clone() }];
        let p = place(&image, &here, &GpuMap::default()).unwrap();
        assert_eq!(indices(&p), [(0, 1), (1, 0)]);
        assert!(pairs(&p, (13, 0)).unwrap().is_empty(), "same UUIDs: the driver finds them itself");
    }

    #[test]
    fn another_machine_gets_equal_models_in_order_and_pairs_by_uuid() {
        let image = machine(1, &["H200", "H200"]);
        let here = machine(2, &["H100", "H200", "H200"]);
        let p = place(&image, &here, &GpuMap::default()).unwrap();
        assert_eq!(indices(&p), [(0, 1), (1, 2)]);
        let pr = pairs(&p, (13, 0)).unwrap();
        assert_eq!(pr.len(), 2);
        assert_eq!(format_uuid(&pr[0].old.bytes), image[0].uuid.clone().unwrap());
        assert_eq!(format_uuid(&pr[1].new.bytes), here[2].uuid.clone().unwrap());
        assert!(pairs(&p, (12, 8)).unwrap_err().contains("CUDA 13.0 or later"));
    }

    #[test]
    fn an_explicit_map_restores_only_what_it_names_and_checks_the_model() {
        let image = machine(1, &["H200", "H200"]);
        let here = machine(1, &["H200", "H200"]);
        let swap = GpuMap::parse("0=1,1=0").unwrap();
        let p = place(&image, &here, &swap).unwrap();
        assert_eq!(indices(&p), [(0, 1), (1, 0)]);
        assert_eq!(pairs(&p, (13, 0)).unwrap().len(), 2);
        let by_uuid =
            GpuMap::parse(&format!("{}={}", image[1].uuid.clone().unwrap(), here[0].uuid.clone().unwrap())).unwrap();
        assert_eq!(indices(&place(&image, &here, &by_uuid).unwrap()), [(1, 0)]);
        let same = place(&image, &here, &GpuMap::parse("0=0").unwrap()).unwrap();
        assert!(pairs(&same, (13, 0)).unwrap().is_empty(), "an explicit map onto the same GPU needs no pairs");
        let mixed = machine(1, &["H200", "H100"]);
        assert!(place(&image, &mixed, &GpuMap::parse("0=1").unwrap()).unwrap_err().contains("same GPU model"));
        assert!(place(&image, &here, &GpuMap::parse("0=1,1=1").unwrap())
            .unwrap_err()
            .contains("two image GPUs on GPU 1"));
        assert!(place(&image, &here, &GpuMap::parse("0=0,0=1").unwrap()).unwrap_err().contains("twice"));
        assert!(place(&image, &here, &GpuMap::parse("5=0").unwrap()).unwrap_err().contains("names image GPU 5"));
        assert!(place(&image, &here, &GpuMap::parse("0=7").unwrap())
            .unwrap_err()
            .contains("names GPU 7, but this machine has 0: H200"));
    }

    #[test]
    fn what_cannot_fit_is_refused_with_the_reason() {
        let image = machine(1, &["H200", "H200"]);
        let one = machine(2, &["H200"]);
        let err = place(&image, &one, &GpuMap::default()).unwrap_err();
        assert!(err.starts_with("image GPU 1 (H200, 85899345920 bytes, GPU-01000000"), "{err}");
        assert!(err.contains("this machine has 0: H200"), "{err}");
        let small = vec![GpuInfo { total_mem_bytes: 1, ..gpu(0, "H200", 2) }, gpu(1, "H200", 2)];
        let err = place(&image, &small, &GpuMap::default()).unwrap_err();
        assert!(err.starts_with("image GPU 1"), "GPU 0 is too small, so image GPU 0 takes GPU 1: {err}");
    }

    #[test]
    fn images_without_uuids_go_back_to_the_same_index_only() {
        let mut image = machine(1, &["H200", "H200"]);
        image.iter_mut().for_each(|g| g.uuid = None);
        let here = machine(2, &["H200", "H200"]);
        let p = place(&image, &here, &GpuMap::default()).unwrap();
        assert_eq!(indices(&p), [(0, 0), (1, 1)]);
        assert!(pairs(&p, (13, 0)).unwrap().is_empty(), "the old behaviour: GPU i onto GPU i");
        let swapped = place(&image, &here, &GpuMap::parse("0=1").unwrap()).unwrap();
        assert!(pairs(&swapped, (13, 0)).unwrap_err().contains("records no UUID for GPU 0"));
    }
}
