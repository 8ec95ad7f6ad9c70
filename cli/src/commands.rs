//! The subcommands, dispatched: each is a function of its module ([`crate::files`],
//! [`crate::process`], [`crate::images`], [`crate::about`], [`crate::containers`], [`crate::load`],
//! [`crate::maintain`], ...) that prints a human summary, or JSON with `--json`.

use crate::args::{Cli, Command, IndexAction};
use crate::output::Output;
use crate::stores::{open_image, open_indexed};
use crate::{about, containers, files, hold, images, load, maintain, process};
use anyhow::Result;
use clap::CommandFactory;
use gstore_capture as capture;
use gstore_progress::Bars;
use gstore_store::{Store, StoreLocation};
use std::time::Duration;

/// Runs the parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    // clap reads GSTORE_STORE into `--store`.
    let location = match &cli.store {
        Some(s) => StoreLocation::parse(s)?,
        None => StoreLocation::default_local(),
    };
    let out = Output { json: cli.json };
    let bars = Bars::new(!cli.json && !cli.quiet);
    match cli.command {
        Command::Init(a) => crate::init::init(&location, a, &out),
        Command::Push { path, tag, meta, exclude, dry_run } => {
            files::push(&location, &path, &tag, &meta, &files::Selection::new(&[], &exclude)?, dry_run, &out, &bars)
        }
        Command::Restore { image, to, run: true, pid_wait, criu, memory_budget, no_lazy, gpu_map, .. } => {
            let opts = capture::RunOptions {
                eager: no_lazy,
                pid_wait: Duration::from_secs(pid_wait),
                memory_budget: gstore_restore::Budget::of(memory_budget),
                gpu_map: gpu_map.unwrap_or_default(),
            };
            process::restore_run(&location, &image, &criu, to, opts, &out, &bars)
        }
        Command::Checkpoint { container: Some(name), tag, leave_running, lock_timeout, runtime, criu, .. } => {
            let how = containers::How { runtime, lock_timeout, criu: criu.criu.as_deref() };
            containers::checkpoint(&location, &name, &tag, leave_running, how, &out, &bars)
        }
        Command::Checkpoint { pid, tag, leave_running, lock_timeout, staging, criu, .. } => {
            let pid = pid.expect("clap requires --pid without --container");
            process::checkpoint(&location, pid, &tag, leave_running, lock_timeout, &criu, staging, &out, &bars)
        }
        Command::Restore { image, container: true, name, runtime, criu, no_lazy, .. } => {
            let how = containers::How { runtime, lock_timeout: 0, criu: criu.criu.as_deref() };
            containers::restore(&location, &image, name.as_deref(), how, no_lazy, &out, &bars)
        }
        Command::Restore { image, archive: Some(file), .. } => {
            containers::write_archive(&location, &image, &file, &out, &bars)
        }
        Command::Restore { image, to, memory_budget, include, exclude, seed, .. } => {
            let to = to.expect("clap requires --to without --run");
            let select = files::Selection::new(&include, &exclude)?;
            files::restore_to(&location, &image, &to, &select, &seed, memory_budget, &out, &bars)
        }
        Command::Load { image, device, check, replicate, memory_budget, held } => {
            let open = || open_image(&location, &image).map(|(s, _, m)| (s, m));
            let r = match held {
                Some(socket) => load::load_held(open, &image, &device, check, &socket)?,
                None => load::load(open, &image, &device, check, replicate, memory_budget, &bars)?,
            };
            out.emit(&r, || load::load_text(&r))
        }
        Command::Hold { images, socket, device, memory_budget } => {
            hold::hold(&location, &images, &socket, &device, memory_budget, &bars)
        }
        Command::Ls { name, sort, latest } => images::ls(&Store::open(&location)?, name.as_deref(), sort, latest, &out),
        Command::Log { tag } => images::log(&Store::open(&location)?, &tag, &out),
        Command::Cat { image, path } => files::cat(&location, &image, &path),
        Command::Diff { a, b } => images::diff(&Store::open(&location)?, &a, &b, &out),
        Command::Copy { images, to } => images::copy(&location, &images, &to, &out, &bars),
        Command::Show { image } => images::show(&Store::open(&location)?, &image, &out),
        Command::Du { prefixes } => images::du(&open_indexed(&location)?, &prefixes, &out),
        Command::Tag { source, target } => images::tag(&location, &source, &target, &out),
        Command::Pin { tags } => images::pin(&location, &tags, true, &out),
        Command::Unpin { tags } => images::pin(&location, &tags, false, &out),
        Command::Rm { images } => images::rm(&location, &images, &out),
        Command::Gc(a) => maintain::run_gc(&location, a, &out, &bars),
        Command::Verify { read_data } => maintain::run_verify(&location, read_data, &out, &bars),
        Command::Serve(a) => crate::serve::serve(&location, a, &out),
        Command::Watch { dir, prefix, remove, once, interval, settle, metrics } => {
            let opts = gstore_container::watch::Options { dir, prefix, remove, settle: Duration::from_secs(settle) };
            containers::watch(&location, &opts, once, Duration::from_secs(interval), metrics.as_deref(), &out)
        }
        Command::Index { action: IndexAction::Rebuild } => maintain::index_rebuild(&location, &out, &bars),
        Command::Key { action } => crate::init::key(&location, action, &out),
        Command::Policy { action } => crate::policy::run(&location, action, &out),
        Command::Version => out.emit(&about::version(), || about::version_text(&about::version())),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "gstore", &mut script);
            Output { json: false }.emit(&(), || String::from_utf8_lossy(&script).trim_end().to_string())
        }
        Command::Man { dir } => about::man(&dir, &out),
    }
}
