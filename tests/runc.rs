//! Containers run by runc itself (no podman involved) through the real binary, runc and CRIU
//! (>= 4): `gstore checkpoint --container ID --runtime runc` into the store, the container
//! gone, `gstore restore TAG --container` back into runc, counting on from its checkpoint; a
//! checkpoint left running found through runc without `--runtime` and adding little; and the
//! failures (no runc, no such container, a stopped container, the wrong runtime, a taken id, a
//! store that fills up while the dump is pushed).
//! The container is the static counter of tests/containers/counter.c in an OCI bundle of its
//! own, writing its count into a bind-mounted directory. scripts/setup.sh installs runc.

use gstore_tests::*;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `runc ARGS`, its standard streams on /dev/null unless captured (CRIU can dump a container
/// only when the files its processes hold open are inside it or on /dev/null).
fn runc(args: &[&str]) -> std::process::Output {
    Command::new("runc").args(args).stdin(Stdio::null()).output().expect("runc runs (scripts/setup.sh installs it)")
}

/// A running counter container in a bundle of its own, deleted on drop.
struct Counter {
    id: String,
    /// The bundle (config.json, rootfs/) and the state directory the count is written into.
    dir: tempfile::TempDir,
    counted: CountFile,
}

impl std::ops::Deref for Counter {
    type Target = CountFile;
    fn deref(&self) -> &CountFile {
        &self.counted
    }
}

impl Counter {
    /// Builds a bundle holding the static counter (MIB MiB of memory) and starts it with
    /// `runc run -d` under an id made from `tag`.
    fn start(tag: &str, mib: u32) -> Counter {
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("bundle/rootfs");
        std::fs::create_dir_all(rootfs.join("state")).unwrap();
        // As in every image: CRIU >= 4.2 restores the read-only root read-only and pivots
        // through its /tmp.
        std::fs::create_dir_all(rootfs.join("tmp")).unwrap();
        std::fs::create_dir_all(dir.path().join("state")).unwrap();
        let source = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo and nextest"))
            .join("containers/counter.c");
        let cc = Command::new("cc").args(["-O2", "-static", "-o"]).arg(rootfs.join("counter")).arg(&source).status();
        assert!(cc.expect("cc").success(), "building {}", source.display());
        let bundle = dir.path().join("bundle");
        let spec = Command::new("runc").args(["spec"]).current_dir(&bundle).status().unwrap();
        assert!(spec.success(), "runc spec");
        let config = bundle.join("config.json");
        let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
        c["process"]["terminal"] = false.into();
        c["process"]["args"] = serde_json::json!(["/counter", mib.to_string()]);
        c["root"]["readonly"] = true.into();
        c["mounts"].as_array_mut().unwrap().push(serde_json::json!({
            "destination": "/state", "type": "bind",
            "source": dir.path().join("state"), "options": ["rbind", "rw"]
        }));
        std::fs::write(&config, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
        let id = format!("gstore-runc-{tag}-{}", std::process::id());
        runc(&["delete", "-f", &id]);
        // runc's own messages go to a log file: its standard streams are the container's.
        let log = dir.path().join("runc.log");
        let out = Command::new("runc")
            .arg("--log")
            .arg(&log)
            .args(["run", "-d", &id])
            .current_dir(&bundle)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(out.success(), "runc run -d {id}: {}", std::fs::read_to_string(&log).unwrap_or_default());
        let counted = CountFile::new(dir.path().join("state/count"), &id);
        let c = Counter { id, dir, counted };
        c.wait_above(2);
        c
    }

    /// runc's status of it, or `None` when runc knows no such container.
    fn status(&self) -> Option<String> {
        let out = runc(&["state", &self.id]);
        out.status.success().then(|| {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            v["status"].as_str().unwrap().to_string()
        })
    }

    fn bundle(&self) -> PathBuf {
        self.dir.path().join("bundle")
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        runc(&["delete", "-f", &self.id]);
        runc(&["delete", "-f", &format!("{}-copy", self.id)]);
    }
}

/// gstore with CRIU >= 4 (`--criu`, which runc gets too) after `args`.
fn gstore(env: &Env, args: &[&str]) -> std::process::Output {
    let criu = criu_args();
    env.run(&with_criu(args, &criu))
}

fn json_ok(env: &Env, args: &[&str]) -> serde_json::Value {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = gstore(env, &full);
    assert!(out.status.success(), "gstore {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn fails(env: &Env, args: &[&str]) -> String {
    let out = gstore(env, args);
    assert!(!out.status.success(), "gstore {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_runc_container_checkpointed_into_the_store_is_restored_and_counts_on() {
    let env = Env::new(&[]);
    let c = Counter::start("cr", 128);
    let r = json_ok(&env, &["checkpoint", "--container", &c.id, "--runtime", "runc", "--tag", "rc:1"]);
    assert_eq!(r["left_running"], false);
    assert_eq!(r["gpu_pids"], serde_json::json!([]), "a CPU container");
    assert!(r["push"]["logical_bytes"].as_u64().unwrap() > 128 << 20, "the 128 MiB of memory are in the image");
    assert_eq!(c.status(), None, "runc's checkpoint ended the container and deleted it");
    let at_dump = c.assert_still();
    let show = env.json(&["show", "rc:1"]);
    assert_eq!(show["meta"]["kind"], "container-checkpoint");
    assert_eq!(show["meta"]["runtime"]["engine"], "runc");
    assert_eq!(show["meta"]["container"]["id"], c.id.as_str());
    assert_eq!(show["meta"]["runc"]["bundle"], c.bundle().to_string_lossy().as_ref());
    let paths: Vec<&str> = show["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert!(paths.contains(&"config.json") && paths.contains(&"checkpoint/pages-1.img"), "{paths:?}");
    // Where its lazy memory is stored is recorded (`index.plans/`): the restore reads that.
    let plans = files_below(&env.store.join("index.plans"));
    assert_eq!(plans.len(), 1, "the checkpoint records where its page image's chunks are: {plans:?}");

    // Through podman it cannot come back; through runc (the image's runtime) it does.
    let err = fails(&env, &["restore", "rc:1", "--container", "--runtime", "podman"]);
    assert!(err.contains("checkpointed through runc"), "{err}");
    let since = Instant::now();
    let r = json_ok(&env, &["restore", "rc:1", "--container"]);
    assert_eq!(r["container"], c.id.as_str());
    // Served lazily: CRIU's page images were not written out; the fill brought the memory.
    assert_eq!(r["mode"], "lazy", "{r}");
    assert!(r["fill"]["lazy_bytes"].as_u64().unwrap() > 120 << 20, "{r}");
    assert!(r["image_bytes"].as_u64().unwrap() < 16 << 20, "{r}");
    assert_eq!(c.status().as_deref(), Some("running"));
    let after = c.counts_on_from(at_dump, since);
    // Its full self-check (every 20 ticks) passes on the restored memory.
    let after = c.wait_above(after + 25);

    // Its id is taken now.
    let err = fails(&env, &["restore", "rc:1", "--container"]);
    assert!(err.contains("runc has a container"), "{err}");

    // Left running, without --runtime: podman does not know it, runc does. It adds about what
    // changed.
    let r2 = json_ok(&env, &["checkpoint", "--container", &c.id, "--tag", "rc:2", "--leave-running"]);
    assert_eq!(r2["left_running"], true);
    assert_eq!(c.status().as_deref(), Some("running"));
    c.wait_above(after + 5);
    let logical = r2["push"]["logical_bytes"].as_u64().unwrap();
    let added = r2["push"]["new_stored_bytes"].as_u64().unwrap();
    assert!(added * 20 < logical, "the second checkpoint added {added} of {logical} bytes");
}

#[test]
fn runc_failures_are_clear_and_tag_nothing() {
    let env = Env::new(&[]);
    let criu = criu_args();
    let args = ["checkpoint", "--container", "gstore-no-such-runc-container", "--runtime", "runc", "--tag", "x:1"];
    let out = gstore(&env, &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "a container runc does not know is not found: {err}");
    assert!(err.contains("no container \"gstore-no-such-runc-container\""), "{err}");

    // No runc on PATH.
    let mut no_runc = env.cmd(&["checkpoint", "--container", "any", "--runtime", "runc", "--tag", "x:1"]);
    no_runc.args(&criu).env("PATH", "/nonexistent");
    let out = no_runc.output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("runc is not installed"), "{:?}", out);

    // A stopped container cannot be checkpointed.
    let c = Counter::start("bad", 16);
    assert!(runc(&["kill", &c.id, "KILL"]).status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.status().as_deref() != Some("stopped") {
        assert!(Instant::now() < deadline, "{} did not stop", c.id);
        std::thread::sleep(Duration::from_millis(50));
    }
    let err = fails(&env, &["checkpoint", "--container", &c.id, "--runtime", "runc", "--tag", "x:1"]);
    assert!(err.contains("only a running container"), "{err}");
    assert!(env.ok(&["ls"]).lines().all(|l| !l.starts_with("x:1")), "nothing tagged");

    // A runc image whose bundle is gone cannot be restored, and says why.
    runc(&["delete", "-f", &c.id]);
    let c = Counter::start("gone", 16);
    json_ok(&env, &["checkpoint", "--container", &c.id, "--runtime", "runc", "--tag", "gone:1"]);
    let moved = c.dir.path().join("bundle-moved");
    std::fs::rename(c.bundle(), &moved).unwrap();
    let err = fails(&env, &["restore", "gone:1", "--container", "--name", &format!("{}-copy", c.id)]);
    assert!(err.contains("bundle") && err.contains("is not here"), "{err}");
    std::fs::rename(&moved, c.bundle()).unwrap();
    // Restored under another id from the same bundle.
    let since = Instant::now();
    let at_dump = c.count().unwrap();
    let copy = format!("{}-copy", c.id);
    let r = json_ok(&env, &["restore", "gone:1", "--container", "--name", &copy, "--no-lazy"]);
    assert_eq!(r["container"], copy.as_str());
    assert_eq!(r["mode"], "eager", "--no-lazy writes the whole image out first: {r}");
    assert!(r["fill"].is_null(), "{r}");
    c.counts_on_from(at_dump, since);
    // --no-lazy restarts something: alone it is refused.
    let err = fails(&env, &["restore", "gone:1", "--to", &env.path("x").to_string_lossy(), "--no-lazy"]);
    assert!(err.contains("--no-lazy"), "{err}");

    // A read-only root without /tmp cannot be restored by CRIU >= 4.2: said, with the fix.
    runc(&["delete", "-f", &copy]);
    std::fs::remove_dir(c.bundle().join("rootfs/tmp")).unwrap();
    let err = fails(&env, &["restore", "gone:1", "--container", "--name", &copy]);
    assert!(err.contains("add an empty /tmp to the image"), "{err}");
    runc(&["delete", "-f", &copy]);
}

#[test]
fn a_store_that_fills_up_mid_push_leaves_the_runc_container_running() {
    // The page images are pushed while runc writes them; the store's disk (2 MiB) fills when
    // the first pack (48 MiB) is written, long before the dump of 400 MiB is read (more than
    // the 256 MiB that may wait for the push): the push's error, not the stopped feeding's.
    let mut env = Env::uninitialized();
    let disk = SmallDisk::mount(&env.path("disk"), "2M");
    env.store = disk.dir.join("store");
    env.ok(&["init"]);
    let c = Counter::start("full", 400);
    for leave_running in [true, false] {
        let mut args = vec!["checkpoint", "--container", &c.id, "--runtime", "runc", "--tag", "x:1"];
        if leave_running {
            args.push("--leave-running");
        }
        let err = fails(&env, &args);
        let after = if leave_running {
            "the container kept running"
        } else {
            "the container was restored from the staged image and runs again"
        };
        assert!(err.contains("No space left on device") && err.contains(after), "{err}");
        assert_eq!(c.status().as_deref(), Some("running"));
        let v = c.wait_above(0);
        c.wait_above(v + 2);
    }
    assert!(env.ok(&["ls"]).lines().all(|l| !l.starts_with("x:1")), "nothing tagged");
}

#[test]
fn a_runc_container_whose_lazy_restore_is_killed_mid_fill_never_runs_on_missing_memory() {
    let env = Env::new(&[]);
    let c = Counter::start("kill", 256);
    json_ok(&env, &["checkpoint", "--container", &c.id, "--runtime", "runc", "--tag", "rk:1"]);
    c.assert_still();
    // Through a 1 MB/s link the fill of 256 MiB takes minutes: it is midway when runc is done.
    let server = Server::start(&env.store, &[]);
    let slow = server.slow_link(1_000_000);
    let criu = criu_args();
    let args = with_criu(&["--json", "restore", "rk:1", "--container"], &criu);
    let mut restore = server.cmd_via(&slow.url, "node", "", &args).stdout(Stdio::null()).spawn().unwrap();
    // runc records the container once CRIU released its processes; they run on lazy memory.
    let deadline = Instant::now() + Duration::from_secs(60);
    let pid = loop {
        let out = runc(&["state", &c.id]);
        if out.status.success() {
            let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if st["status"] == "running" {
                break st["pid"].as_u64().unwrap();
            }
        }
        assert!(Instant::now() < deadline, "the container was never restored");
        assert!(restore.try_wait().unwrap().is_none(), "gstore ended before the container was restored");
        std::thread::sleep(Duration::from_millis(5));
    };
    let finished = restore.try_wait().unwrap();
    restore.kill().unwrap();
    restore.wait().unwrap();
    assert!(finished.is_none(), "the fill of 256 MiB through 1 MB/s ended before runc did");
    // Its processes are killed (its host pids came with the records CRIU's tasks sent), and
    // none of them ever saw a missing page as zeros (the counter would have written BAD).
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
    {
        assert!(Instant::now() < deadline, "the restored container's init (pid {pid}) runs on without its memory");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.count();
    let deadline = Instant::now() + Duration::from_secs(10);
    while runc(&["state", &c.id]).stdout.windows(9).all(|w| w != b"\"stopped\"") {
        assert!(Instant::now() < deadline, "runc still counts {} as running", c.id);
        std::thread::sleep(Duration::from_millis(20));
    }
    // Nor is `runc restore` (or its CRIU, which waits for ever once its tasks die before it
    // has finished) left behind.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = restoring(&c.id);
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left running after gstore died: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_damaged_chunk_mid_fill_ends_the_runc_container_and_names_the_chunk() {
    let env = Env::new(&[]);
    let c = Counter::start("dmg", 128);
    json_ok(&env, &["checkpoint", "--container", &c.id, "--runtime", "runc", "--tag", "rd:1"]);
    c.assert_still();
    let chunk = damage_a_chunk(&env, "rd:1", |path| path.starts_with("checkpoint/pages-"));
    let out = gstore(&env, &["restore", "rd:1", "--container"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "damage exits 4: {err}");
    assert!(err.contains(&chunk) && err.contains("corrupt chunk"), "{err}");
    assert!(err.contains("processes were killed"), "{err}");
    // Nothing of it runs on: not the container (deleted), not runc or its CRIU.
    assert_eq!(c.status(), None, "runc still knows {}", c.id);
    assert!(restoring(&c.id).is_empty(), "left running: {:?}", restoring(&c.id));
    c.count();
}

/// The command lines of processes restoring container `id` (`runc … restore … ID`, CRIU's
/// `restore --rpc` in runc's work directory for it).
fn restoring(id: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> = cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let runc_restore = args.iter().any(|a| a == "restore") && args.last().is_some_and(|a| a == id);
        let criu_restore = args.first().is_some_and(|a| a.starts_with("criu: restore"))
            || (args.iter().any(|a| a == "--rpc") && args.iter().any(|a| a == "restore"));
        if runc_restore || (criu_restore && args.iter().any(|a| a.contains("gstore-runc-restore-"))) {
            out.push(args.join(" "));
        }
    }
    out
}
