//! CRIU image files gstore reads itself (pstree, mm, pagemap), first byte choosing which.
#![no_main]
use gstore_gpu_dump::images;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    match which % 3 {
        0 => drop(images::parse_pstree(rest)),
        1 => drop(images::parse_mm(rest)),
        _ => drop(images::parse_pagemap(rest)),
    }
});
