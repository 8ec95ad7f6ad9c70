//! Test helpers shared by the unit tests.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Fake `criu` scripts that print a version line, all written once before any is run: a
/// script executed while another thread still holds it open for writing (or a child forked
/// meanwhile does) fails with ETXTBSY.
struct FakeCrius {
    _dir: tempfile::TempDir,
    new: PathBuf,
    old: PathBuf,
    garbage: PathBuf,
}

fn fakes() -> &'static FakeCrius {
    static FAKES: OnceLock<FakeCrius> = OnceLock::new();
    FAKES.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, line: &str| {
            use std::os::unix::fs::PermissionsExt;
            let path = dir.path().join(name).join("criu");
            std::fs::create_dir(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, format!("#!/bin/sh\necho '{line}'\n")).expect("write fake criu");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            path
        };
        let new = write("new", "Version: 4.2");
        let old = write("old", "Version: 3.17.1");
        let garbage = write("garbage", "hello");
        FakeCrius { _dir: dir, new, old, garbage }
    })
}

/// A fake CRIU 4.2.
pub fn fake_criu_4_2() -> &'static Path {
    &fakes().new
}

/// A fake CRIU 3.17.1.
pub fn fake_criu_3_17() -> &'static Path {
    &fakes().old
}

/// A program that prints no version.
pub fn fake_criu_garbage() -> &'static Path {
    &fakes().garbage
}
