//! CRIU image files gstore reads itself (pstree, mm, pagemap), first byte choosing which.
use gstore_gpu_dump::images;

/// Runs one input; panics on a bug.
pub fn run(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else { return };
    match which % 3 {
        0 => drop(images::parse_pstree(rest)),
        1 => drop(images::parse_mm(rest)),
        _ => drop(images::parse_pagemap(rest)),
    }
}
