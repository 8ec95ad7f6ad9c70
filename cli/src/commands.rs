//! One function per subcommand; each prints a human summary, or JSON with `--json`.

use crate::args::{Cli, Command, CriuArgs, IndexAction, Sort};
use crate::failure::Usage;
use crate::output::{plural, push_summary, rate, Output};
use crate::stores::{open_image, open_indexed};
use crate::{containers, hold, load, maintain};
use anyhow::{Context, Result};
use clap::CommandFactory;
use gstore_capture as capture;
use gstore_progress::Bars;
use gstore_store::format::meta::ImageMeta;
use gstore_store::{
    commands::images, commands::push, commands::usage, IndexedStore, ObjectKind, Store, StoreError, StoreLocation,
    TagRef,
};
use indicatif::HumanBytes;
use serde::Serialize;
use std::collections::BTreeMap;
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
            push(&location, &path, &tag, &meta, &Selection::new(&[], &exclude)?, dry_run, &out, &bars)
        }
        Command::Restore { image, to, run: true, pid_wait, criu, memory_budget, no_lazy, gpu_map, .. } => {
            let opts = capture::RunOptions {
                eager: no_lazy,
                pid_wait: Duration::from_secs(pid_wait),
                memory_budget: gstore_restore::Budget::of(memory_budget),
                gpu_map: gpu_map.unwrap_or_default(),
            };
            restore_run(&location, &image, &criu, to, opts, &out, &bars)
        }
        Command::Checkpoint { container: Some(name), tag, leave_running, lock_timeout, runtime, criu, .. } => {
            let how = containers::How { runtime, lock_timeout, criu: criu.criu.as_deref() };
            containers::checkpoint(&location, &name, &tag, leave_running, how, &out, &bars)
        }
        Command::Checkpoint { pid, tag, leave_running, lock_timeout, staging, criu, .. } => {
            let pid = pid.expect("clap requires --pid without --container");
            checkpoint(&location, pid, &tag, leave_running, lock_timeout, &criu, staging, &out, &bars)
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
            let select = Selection::new(&include, &exclude)?;
            restore_to(&location, &image, &to, &select, &seed, memory_budget, &out, &bars)
        }
        Command::Load { image, device, check, replicate, memory_budget, held } => {
            let open = || open_image(&location, &image).map(|(s, _, m)| (s, m));
            let r = match held {
                Some(socket) => load::load_held(open, &image, &device, check, &socket)?,
                None => load::load(open, &image, &device, check, replicate, memory_budget, &bars)?,
            };
            out.emit(&r, || load_text(&r))
        }
        Command::Hold { images, socket, device, memory_budget } => {
            hold::hold(&location, &images, &socket, &device, memory_budget, &bars)
        }
        Command::Ls { name, sort, latest } => ls(&Store::open(&location)?, name.as_deref(), sort, latest, &out),
        Command::Log { tag } => log(&Store::open(&location)?, &tag, &out),
        Command::Cat { image, path } => cat(&location, &image, &path),
        Command::Diff { a, b } => diff(&Store::open(&location)?, &a, &b, &out),
        Command::Copy { images, to } => copy(&location, &images, &to, &out, &bars),
        Command::Show { image } => show(&Store::open(&location)?, &image, &out),
        Command::Du { prefixes } => du(&open_indexed(&location)?, &prefixes, &out),
        Command::Tag { source, target } => tag(&location, &source, &target, &out),
        Command::Pin { tags } => pin(&location, &tags, true, &out),
        Command::Unpin { tags } => pin(&location, &tags, false, &out),
        Command::Rm { images } => rm(&location, &images, &out),
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
        Command::Version => out.emit(&version(), || version_text(&version())),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "gstore", &mut script);
            Output { json: false }.emit(&(), || String::from_utf8_lossy(&script).trim_end().to_string())
        }
        Command::Man { dir } => man(&dir, &out),
    }
}

/// `gstore push`.
#[allow(clippy::too_many_arguments)]
fn push(
    location: &StoreLocation,
    path: &std::path::Path,
    tag: &str,
    meta: &[String],
    select: &Selection,
    dry_run: bool,
    out: &Output,
    bars: &Bars,
) -> Result<()> {
    let tag = TagRef::parse_new(tag)?;
    let meta = parse_meta(meta)?;
    if path.as_os_str() == "-" || (path.is_file() && gstore_container::archive::is_checkpoint_archive(path)) {
        if dry_run || !select.is_everything() {
            return Err(
                Usage("an archive is pushed whole: --dry-run and --exclude take a directory or a file".into()).into()
            );
        }
        return containers::push_archive(location, path, &tag, meta, out, bars);
    }
    if let Err(e) = path.symlink_metadata() {
        return Err(Usage(format!("cannot push {}: {e}", path.display())).into());
    }
    let store = open_indexed(location)?;
    let r = push::push_selected(&store, path, &|rel| select.chosen(rel), dry_run, &tag, meta, bars)
        .with_context(|| format!("push of {} failed", path.display()))?;
    let verb = if r.dry_run { "would push" } else { "pushed" };
    out.emit(&r, || push_summary(verb, &path.display().to_string(), &r))
}

/// `gstore restore --run`.
fn restore_run(
    location: &StoreLocation,
    image: &str,
    criu: &CriuArgs,
    to: Option<std::path::PathBuf>,
    opts: capture::RunOptions,
    out: &Output,
    bars: &Bars,
) -> Result<()> {
    let store = open_indexed(location)?;
    let r = capture::run(&store, image, criu_choice(criu), to, opts, bars)?;
    out.emit(&r, || {
            let t = &r.restore.timings;
            let mut text = format!("restored {image} as pid {} ({} memory)\nphases: write image {:.2} s, wait for pid {:.2} s, criu restore {:.2} s", r.pid, r.mode, r.materialize_s, t.pid_wait_s, t.criu_restore_s);
            if let (Some(a), Some(b)) = (t.gpu_restore_s, t.gpu_unlock_s) {
                text.push_str(&format!(", GPU restore {a:.2} s, unlock {b:.2} s"));
            }
            text.push_str(&format!(", total {:.2} s", r.total_s));
            if let Some(f) = &r.fill {
                text.push_str(&format!(
                    "\nmemory: served from the store while the process ran, complete {:.2} s after criu restore ({} faults served)",
                    f.fill_s, f.faults
                ));
            }
            if let Some(p) = &r.profile {
                text.push_str(&format!("; {p}"));
            }
            if let Some(s) = r.weights_refill_s {
                text.push_str(&format!("\nweights: refilled from the store by the process, done {s:.2} s after its GPU state was back"));
            }
            if let Some(why) = &r.eager_reason {
                text.push_str(&format!("\nrestored eagerly: {why}"));
            }
            text
        })
}

/// `gstore checkpoint`.
#[allow(clippy::too_many_arguments)]
fn checkpoint(
    location: &StoreLocation,
    pid: u32,
    tag: &str,
    leave_running: bool,
    lock_timeout: u32,
    criu: &CriuArgs,
    staging: Option<std::path::PathBuf>,
    out: &Output,
    bars: &Bars,
) -> Result<()> {
    let tag = TagRef::parse_new(tag)?;
    // The store lock is taken before the process is frozen, so it never waits frozen.
    let store = open_indexed(location)?;
    let r = capture::checkpoint(&store, pid, &tag, leave_running, lock_timeout, criu_choice(criu), staging, bars)?;
    out.emit(&r, || {
            let t = &r.capture.timings;
            let opt = |v: Option<f64>| v.map(|s| format!("{s:.2} s")).unwrap_or_else(|| "-".into());
            let gpu_pids = &r.capture.gpu_pids;
            let others = if gpu_pids.len() > 1 {
                let pids: Vec<String> = gpu_pids.iter().map(u32::to_string).collect();
                format!(", GPU state of processes {}", pids.join(", "))
            } else {
                String::new()
            };
            let weights = r.weights.as_ref().map_or_else(String::new, |w| {
                let back = w.refill_s.map(|s| format!(", refilled in {s:.2} s")).unwrap_or_default();
                format!("\nweights: {} left out of the image (from {} process(es)), released in {:.2} s{back}", HumanBytes(w.bytes), w.processes, w.release_s)
            });
            format!(
                "checkpointed pid {pid} ({}{others}) as {} ({}, {} new)\nphases: GPU lock {}, GPU checkpoint {}, criu dump {:.2} s, GPU resume {}, store {:.2} s, total {:.2} s{}{weights}\nmanifest {}",
                r.capture.image_kind,
                r.push.tag,
                HumanBytes(r.push.logical_bytes),
                HumanBytes(r.push.new_stored_bytes),
                opt(t.lock_s),
                opt(t.gpu_checkpoint_s),
                t.criu_dump_s,
                opt(t.gpu_resume_s),
                r.push.seconds,
                r.total_s,
                r.paused_s.map(|p| format!(" (process paused {p:.2} s)")).unwrap_or_default(),
                r.push.manifest
            )
        })
}

/// `gstore restore --to DIR`.
#[allow(clippy::too_many_arguments)]
fn restore_to(
    location: &StoreLocation,
    image: &str,
    to: &std::path::Path,
    select: &Selection,
    seeds: &[std::path::PathBuf],
    memory_budget: u64,
    out: &Output,
    bars: &Bars,
) -> Result<()> {
    let (store, id, m) = open_image(location, image)?;
    let m = select.apply(m)?;
    let seed = if seeds.is_empty() {
        None
    } else {
        Some(gstore_restore::seed::Seed::index(seeds, store.config(), &store.chunk_ids(), bars)?)
    };
    let r = gstore_restore::restore_to_dir_seeded(
        &store,
        &id,
        &m,
        to,
        gstore_restore::Budget::of(memory_budget),
        seed.as_ref(),
        bars,
    )
    .with_context(|| format!("restore of {image} failed"))?;
    out.emit(&r, || {
        let resumed = if r.resumed_chunks > 0 {
            format!(", resumed: {} chunks were already in place", r.resumed_chunks)
        } else {
            String::new()
        };
        let seeded = match &seed {
            Some(s) => format!(
                ", {} of it copied from the seed ({} indexed), {} fetched",
                HumanBytes(r.seeded_bytes),
                HumanBytes(s.indexed_bytes()),
                HumanBytes(r.fetched_bytes)
            ),
            None => String::new(),
        };
        format!(
            "restored {image} into {} ({}, {}, {}{resumed}{seeded})",
            r.destination,
            plural(r.entries as u64, "entry", "entries"),
            HumanBytes(r.logical_bytes),
            rate(r.logical_bytes, r.seconds)
        )
    })
}

/// `gstore load`'s summary.
fn load_text(r: &load::LoadReport) -> String {
    format!(
        "loaded {} into {} in {:.2} s: {}{}{}{}{}",
        HumanBytes(r.bytes),
        r.device,
        r.seconds,
        rate(r.bytes, r.seconds),
        r.phases
            .map(|[p, a, t]| format!(" (plan {p:.2} s, allocate {a:.2} s, transfer {t:.2} s: {})", rate(r.bytes, t)))
            .unwrap_or_default(),
        if r.checked { " (read back and checked)" } else { "" },
        r.per_device.iter().flatten().map(|d| format!("\n{}: {}", d.device, HumanBytes(d.bytes))).collect::<String>(),
        r.path.as_deref().map(|p| format!("\n{p}")).unwrap_or_default()
    )
}

/// `gstore tag`.
fn tag(location: &StoreLocation, source: &str, target: &str, out: &Output) -> Result<()> {
    let rec = images::tag(&open_indexed(location)?, source, target)?;
    out.emit(&rec, || format!("tagged {} -> {}", rec.tag(), rec.manifest))
}

/// `gstore pin` / `gstore unpin`.
fn pin(location: &StoreLocation, tags: &[String], pinned: bool, out: &Output) -> Result<()> {
    let store = Store::open(location)?;
    let tags =
        tags.iter().map(|t| TagRef::parse(t).map_err(StoreError::from)).collect::<gstore_store::Result<Vec<_>>>()?;
    for tag in &tags {
        store.set_pinned(tag, pinned)?;
    }
    let names: Vec<String> = tags.iter().map(ToString::to_string).collect();
    let word = if pinned { "pinned" } else { "unpinned" };
    out.emit(&serde_json::json!({ word: names }), || {
        names.iter().map(|t| format!("{word} {t}")).collect::<Vec<_>>().join("\n")
    })
}

/// `gstore rm`: every tag named, each checked before any is removed.
fn rm(location: &StoreLocation, images: &[String], out: &Output) -> Result<()> {
    let names: Vec<&str> = images.iter().map(String::as_str).collect();
    let tags = images::remove_tags(&Store::open(location)?, &names)?;
    let removed: Vec<String> = tags.iter().map(|t| t.tag.to_string()).collect();
    let pinned: Vec<String> = tags.iter().filter(|t| t.pinned).map(|t| t.tag.to_string()).collect();
    for t in &pinned {
        eprintln!("gstore: warning: {t} was pinned; its pin went with it (retention no longer keeps its image)");
    }
    out.emit(&serde_json::json!({ "removed": removed, "pinned": pinned }), || {
        removed.iter().map(|t| format!("removed tag {t}")).collect::<Vec<_>>().join("\n")
            + "\n(space is reclaimed by gc)"
    })
}

/// `gstore log`.
fn log(store: &Store, tag: &str, out: &Output) -> Result<()> {
    let entries = images::log(store, tag)?;
    out.emit(&entries, || {
        let width = entries.iter().map(|e| e.tag.len()).max().unwrap_or(3).max(3);
        let mut s = format!("{:<20}  {:<width$}  {:<12}", "SET", "TAG", "IMAGE");
        for e in &entries {
            let now = if e.current { "  (current)" } else { "" };
            s.push_str(&format!(
                "\n{:<20}  {:<width$}  {:<12}{now}",
                e.set,
                e.tag,
                &e.manifest[..12.min(e.manifest.len())]
            ));
        }
        s
    })
}

/// `gstore copy`.
fn copy(location: &StoreLocation, images: &[String], to: &str, out: &Output, bars: &Bars) -> Result<()> {
    let target = StoreLocation::parse(to)?;
    if target == *location {
        return Err(Usage(format!("--to {to} is the store the images are in")).into());
    }
    let tags =
        images.iter().map(|i| TagRef::parse(i).map_err(StoreError::from)).collect::<gstore_store::Result<Vec<_>>>()?;
    let src = open_indexed(location)?;
    for t in &tags {
        src.resolve(&t.to_string())?;
    }
    // Opening a plain target with the source's key set would say to unset it: say what copy
    // says of two stores that name chunks differently instead.
    if src.config().encryption.is_some() {
        let plain_target =
            target.backend().and_then(|b| Store::read_config(&b, &target)).is_ok_and(|c| c.encryption.is_none());
        if plain_target {
            return Err(Usage(format!(
                "{} is encrypted and {to} is not: they name chunks differently, so images are not copied between them; restore the image and push it",
                location.describe()
            ))
            .into());
        }
    }
    let dst = open_indexed(&target).with_context(|| format!("opening the target store {to}"))?;
    let mut reports = Vec::new();
    for t in &tags {
        reports.push(
            gstore_store::commands::copy::copy(&src, &dst, t, bars).with_context(|| format!("copy of {t} failed"))?,
        );
    }
    out.emit(&reports, || {
        reports
            .iter()
            .map(|r| {
                format!(
                    "copied {} to {} ({} of {} chunks sent, {} in {}, {})",
                    r.tag,
                    dst.describe(),
                    r.copied_chunks,
                    r.chunks,
                    HumanBytes(r.copied_stored_bytes),
                    plural(r.packs, "pack", "packs"),
                    rate(r.copied_stored_bytes, r.seconds)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// `gstore diff`.
fn diff(store: &Store, a: &str, b: &str, out: &Output) -> Result<()> {
    let d = images::diff(store, a, b)?;
    out.emit(&d, || {
        let size = |s: Option<u64>| s.map(|b| HumanBytes(b).to_string()).unwrap_or_else(|| "-".into());
        let mut s = format!("{:<8} {:>10} {:>10} {:>14}  PATH", "CHANGE", "SIZE A", "SIZE B", "PLAIN NEW IN B");
        for c in &d.changes {
            s.push_str(&format!(
                "\n{:<8} {:>10} {:>10} {:>14}  {}",
                c.change,
                size(c.size_a),
                size(c.size_b),
                HumanBytes(c.new_bytes).to_string(),
                c.path
            ));
        }
        let n = d.changes.len() as u64;
        s.push_str(&format!(
            "\n{} {}; {b} adds {} to {a}, which holds {} that {b} does not (plain bytes of chunks, \
             before deduplication against the rest of the store and compression: `push` reports \
             the stored bytes it added)",
            plural(n, "path", "paths"),
            if n == 1 { "differs" } else { "differ" },
            HumanBytes(d.only_in_b_bytes),
            HumanBytes(d.only_in_a_bytes)
        ));
        s
    })
}

/// `gstore cat`: the file's bytes on stdout.
fn cat(location: &StoreLocation, image: &str, path: &str) -> Result<()> {
    let (store, _, m) = open_image(location, image)?;
    let mut stdout = std::io::stdout().lock();
    gstore_restore::cat::write_file(&store, &m, path, &mut stdout)?;
    Ok(())
}

/// What `restore --include / --exclude` keep.
struct Selection {
    include: Option<globset::GlobSet>,
    exclude: Option<globset::GlobSet>,
}

impl Selection {
    fn new(include: &[String], exclude: &[String]) -> Result<Selection> {
        let set = |patterns: &[String], flag: &str| -> Result<Option<globset::GlobSet>> {
            if patterns.is_empty() {
                return Ok(None);
            }
            let mut b = globset::GlobSetBuilder::new();
            for p in patterns {
                let glob = globset::GlobBuilder::new(p.trim_end_matches('/'))
                    .literal_separator(true)
                    .build()
                    .map_err(|e| Usage(format!("{flag} {p:?}: {e}")))?;
                b.add(glob);
            }
            Ok(Some(b.build().map_err(|e| Usage(format!("{flag}: {e}")))?))
        };
        Ok(Selection { include: set(include, "--include")?, exclude: set(exclude, "--exclude")? })
    }

    /// Whether `path` or a directory above it matches `set`.
    fn matches(set: &globset::GlobSet, path: &str) -> bool {
        let mut p = path;
        loop {
            if set.is_match(p) {
                return true;
            }
            match p.rfind('/') {
                Some(i) => p = &p[..i],
                None => return false,
            }
        }
    }

    /// Whether every entry is selected (no --include, no --exclude).
    fn is_everything(&self) -> bool {
        self.include.is_none() && self.exclude.is_none()
    }

    /// Whether `path` is selected: included (or no --include), and not excluded.
    fn chosen(&self, path: &str) -> bool {
        self.include.as_ref().is_none_or(|s| Self::matches(s, path))
            && !self.exclude.as_ref().is_some_and(|s| Self::matches(s, path))
    }

    /// The image with only the selected entries and the directories above them.
    fn apply(&self, m: gstore_store::format::manifest::Manifest) -> Result<gstore_store::format::manifest::Manifest> {
        if self.is_everything() {
            return Ok(m);
        }
        let chosen = |path: &str| self.chosen(path);
        let mut keep: std::collections::HashSet<&str> =
            m.entries.iter().filter(|e| chosen(&e.path)).map(|e| e.path.as_str()).collect();
        if keep.is_empty() {
            return Err(
                Usage("--include / --exclude select no entry of the image (`gstore show` lists them)".into()).into()
            );
        }
        let parents: Vec<&str> = keep.iter().flat_map(|p| p.match_indices('/').map(move |(i, _)| &p[..i])).collect();
        keep.extend(parents);
        let keep: std::collections::HashSet<String> = keep.into_iter().map(str::to_string).collect();
        Ok(m.subset(|e| keep.contains(&e.path)))
    }
}

/// What `gstore version` reports.
#[derive(Serialize)]
struct Version {
    version: &'static str,
    commit: &'static str,
    target: String,
    rustc: &'static str,
    store_format: u32,
    profile: &'static str,
}

fn version() -> Version {
    Version {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("GSTORE_COMMIT"),
        target: format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS),
        rustc: env!("GSTORE_RUSTC"),
        store_format: gstore_store::FORMAT_VERSION,
        profile: if cfg!(debug_assertions) { "debug" } else { "release" },
    }
}

fn version_text(v: &Version) -> String {
    format!(
        "gstore {} (commit {}, {} build)\nplatform {}\nbuilt with {}\nstore format {}",
        v.version, v.commit, v.profile, v.target, v.rustc, v.store_format
    )
}

/// `gstore man DIR`: gstore.1 and gstore-COMMAND.1 for every command.
fn man(dir: &std::path::Path, out: &Output) -> Result<()> {
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

fn criu_choice(a: &CriuArgs) -> capture::CriuChoice<'_> {
    capture::CriuChoice { path: a.criu.as_deref(), extra: a.criu_opts.clone(), shell_job: a.shell_job }
}

fn parse_meta(items: &[String]) -> Result<ImageMeta> {
    let mut meta = BTreeMap::new();
    for item in items {
        let Some((k, v)) = item.split_once('=') else {
            return Err(Usage(format!("--meta {item:?}: expected KEY=VALUE")).into());
        };
        meta.insert(k.to_string(), serde_json::Value::String(v.to_string()));
    }
    Ok(ImageMeta::from_map(meta))
}

fn ls(store: &Store, name: Option<&str>, sort: Sort, latest: bool, out: &Output) -> Result<()> {
    let name_of = |tag: &str| tag.split_once(':').map_or(tag, |(n, _)| n).to_string();
    let mut rows = images::list(store)?;
    if let Some(want) = name {
        // NAME, NAME:VERSION, or a name prefix ending in `*`.
        rows.retain(|r| match want.strip_suffix('*') {
            Some(prefix) => name_of(&r.tag).starts_with(prefix),
            None if want.contains(':') => r.tag == want,
            None => name_of(&r.tag) == want,
        });
        if rows.is_empty() && !want.ends_with('*') {
            let what = if want.contains(':') { ObjectKind::Tag } else { ObjectKind::TagName };
            return Err(StoreError::NotFound { what, key: want.to_string() }.into());
        }
    }
    let newest_first = |a: &images::ImageRow, b: &images::ImageRow| b.created_unix.cmp(&a.created_unix);
    if latest {
        rows.sort_by(|a, b| name_of(&a.tag).cmp(&name_of(&b.tag)).then(newest_first(a, b)));
        rows.dedup_by(|later, first| name_of(&later.tag) == name_of(&first.tag));
    }
    match sort {
        Sort::Name => rows.sort_by(|a, b| a.tag.split_once(':').cmp(&b.tag.split_once(':'))),
        Sort::Time => rows.sort_by_key(|r| std::cmp::Reverse(r.created_unix)),
        Sort::Size => rows.sort_by_key(|r| std::cmp::Reverse(r.logical_bytes)),
    }
    out.emit(&rows, || {
        let width = rows.iter().map(|r| r.tag.len()).max().unwrap_or(3).max(3);
        let mut s =
            format!("{:<width$}  {:<12}  {:<20}  {:>10}  {:>7}  PINNED", "TAG", "IMAGE", "CREATED", "SIZE", "HISTORY");
        for r in &rows {
            let size = r.logical_bytes.map(|b| HumanBytes(b).to_string()).unwrap_or_else(|| "damaged".into());
            let created = r.created.as_deref().unwrap_or("?");
            let line = format!(
                "{:<width$}  {:<12}  {:<20}  {:>10}  {:>7}  {}",
                r.tag,
                r.manifest.get(..12).unwrap_or(""),
                created,
                size,
                r.history,
                if r.pinned { "yes" } else { "" }
            );
            s.push('\n');
            s.push_str(line.trim_end());
            if let Some(e) = &r.error {
                s.push_str(&format!("\n  error: {e}"));
            }
        }
        s
    })
}

fn show(store: &Store, image: &str, out: &Output) -> Result<()> {
    let info = images::show(store, image)?;
    out.emit(&info, || {
        let mut s = format!(
            "image {image}\nmanifest {}\ncreated {}\nsize {} in {}, {}",
            info.manifest,
            info.created,
            HumanBytes(info.logical_bytes),
            plural(info.entries.len() as u64, "entry", "entries"),
            plural(info.chunks as u64, "chunk", "chunks")
        );
        for (k, v) in &info.meta.to_map() {
            s.push_str(&format!("\nmeta {k} = {v}"));
        }
        s.push_str(&format!("\n{:<7} {:>6} {:>12} {:>8} {:>6}  PATH", "KIND", "MODE", "SIZE", "CHUNKS", "ZERO"));
        for e in &info.entries {
            let kind = format!("{:?}", e.kind).to_lowercase();
            let path = match &e.target {
                Some(t) => format!("{} -> {t}", e.path),
                None => e.path.clone(),
            };
            s.push_str(&format!(
                "\n{kind:<7} {:>6} {:>12} {:>8} {:>6}  {path}",
                e.mode,
                HumanBytes(e.size).to_string(),
                e.chunks,
                e.zero_chunks
            ));
        }
        s
    })
}

fn du(store: &IndexedStore, prefixes: &[String], out: &Output) -> Result<()> {
    let u = usage::usage_by(store, prefixes)?;
    out.emit(&u, || {
        let mut s = format!(
            "logical   {}\nunique    {} (dedup {:.2}x)\nstored    {} (compression {:.2}x)\npacks     {} in {}",
            HumanBytes(u.logical_bytes),
            HumanBytes(u.unique_plain_bytes),
            u.dedup_ratio,
            HumanBytes(u.referenced_stored_bytes),
            u.compression_ratio,
            HumanBytes(u.pack_bytes),
            plural(u.packs as u64, "pack", "packs")
        );
        if u.missing_chunks > 0 {
            s.push_str(&format!("\nwarning: {} referenced chunks are missing: run `gstore verify`", u.missing_chunks));
        }
        let width = u.images.iter().map(|i| i.tag.len()).max().unwrap_or(3).max(3);
        s.push_str(&format!("\n{:<width$}  {:>12} {:>14}", "TAG", "LOGICAL", "UNIQUE STORED"));
        for i in &u.images {
            s.push_str(&format!(
                "\n{:<width$}  {:>12} {:>14}",
                i.tag,
                HumanBytes(i.logical_bytes).to_string(),
                HumanBytes(i.unique_stored_bytes).to_string()
            ));
        }
        if !u.prefixes.is_empty() {
            let width = u.prefixes.iter().map(|p| p.prefix.len() + 2).max().unwrap_or(6).max(6);
            s.push_str(&format!(
                "

{:<width$}  {:>6} {:>12} {:>12} {:>14}",
                "PREFIX", "IMAGES", "LOGICAL", "STORED", "UNIQUE STORED"
            ));
            for p in &u.prefixes {
                s.push_str(&format!(
                    "
{:<width$}  {:>6} {:>12} {:>12} {:>14}",
                    format!("{:?}", p.prefix),
                    p.images,
                    HumanBytes(p.logical_bytes).to_string(),
                    HumanBytes(p.stored_bytes).to_string(),
                    HumanBytes(p.unique_stored_bytes).to_string()
                ));
            }
        }
        s
    })
}
