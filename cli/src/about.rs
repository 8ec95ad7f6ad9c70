//! What gstore is: `gstore version`, `gstore man`.

use crate::args::Cli;
use crate::output::Output;
use anyhow::{Context, Result};
use clap::CommandFactory;
use serde::Serialize;

/// What `gstore version` reports.
#[derive(Serialize)]
pub(crate) struct Version {
    version: &'static str,
    commit: &'static str,
    target: String,
    rustc: &'static str,
    store_format: u32,
    profile: &'static str,
}

/// What `gstore version` reports for this binary.
pub(crate) fn version() -> Version {
    Version {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("GSTORE_COMMIT"),
        target: format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS),
        rustc: env!("GSTORE_RUSTC"),
        store_format: gstore_store::FORMAT_VERSION,
        profile: if cfg!(debug_assertions) { "debug" } else { "release" },
    }
}

/// `gstore version`'s text.
pub(crate) fn version_text(v: &Version) -> String {
    format!(
        "gstore {} (commit {}, {} build)\nplatform {}\nbuilt with {}\nstore format {}",
        v.version, v.commit, v.profile, v.target, v.rustc, v.store_format
    )
}

/// `gstore man DIR`: gstore.1 and gstore-COMMAND.1 for every command.
pub(crate) fn man(dir: &std::path::Path, out: &Output) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cmd = Cli::command();
    let mut written = Vec::new();
    let mut write = |name: String, c: clap::Command| -> Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(c).render(&mut buf)?;
        std::fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))?;
        written.push(path.display().to_string());
        Ok(())
    };
    for sub in cmd.get_subcommands() {
        let name = format!("gstore-{}", sub.get_name());
        write(name.clone(), sub.clone().display_name(name))?;
    }
    write("gstore".into(), cmd)?;
    out.emit(&serde_json::json!({ "written": written }), || {
        format!("wrote {} man pages into {}", written.len(), dir.display())
    })
}
