//! Lazy process restores (gstore as CRIU's lazy-pages daemon) with real CRIU: a process tree
//! with known memory checks itself after restore; a child forked while memory is being
//! filled; a damaged chunk, a store server killed mid-fill and a daemon killed mid-fill must
//! leave no process running.

use gstore_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const TREE_PY: &str = include_str!("lazy_tree.py");
const CRIU: &str = "/opt/criu/sbin/criu";

/// The test program's tree: parent and child pids, and its output directory.
struct Tree {
    parent: u32,
    child: u32,
    dir: tempfile::TempDir,
}

impl Tree {
    fn start(mb: u32) -> Tree {
        assert!(Path::new(CRIU).exists(), "CRIU >= 4 is not installed at {CRIU}: run scripts/criu.sh");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let parent = spawn_detached_python(dir.path(), TREE_PY, &[out.as_os_str(), mb.to_string().as_ref()]);
        let mut t = Tree { parent, child: 0, dir };
        t.wait_file("ready-parent", Duration::from_secs(60));
        t.wait_file("ready-child", Duration::from_secs(60));
        let child = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap();
        t.child = child.trim().parse().expect("one child");
        t
    }

    fn out(&self, name: &str) -> PathBuf {
        self.dir.path().join("out").join(name)
    }

    fn wait_file(&self, name: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(s) = std::fs::read_to_string(self.out(name)) {
                return s;
            }
            assert!(Instant::now() < deadline, "{name} did not appear within {limit:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Asks `role` for the checksum of its memory now and compares it with the one at start.
    fn assert_intact(&self, role: &str) {
        let _ = std::fs::remove_file(self.out(&format!("result-{role}")));
        std::fs::write(self.out(&format!("go-{role}")), "").unwrap();
        let now = self.wait_file(&format!("result-{role}"), Duration::from_secs(60));
        assert_eq!(
            now,
            std::fs::read_to_string(self.out(&format!("ready-{role}"))).unwrap(),
            "{role}'s memory differs"
        );
    }

    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()))
            .is_some_and(|state| state != 'Z' && state != 'X')
    }

    fn wait_gone(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while [self.parent, self.child].iter().any(|&p| Path::new(&format!("/proc/{p}")).exists()) {
            assert!(Instant::now() < deadline, "the tree ({}, {}) is still there", self.parent, self.child);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the restored tree (so that its image can be restored again).
    fn kill(&self) {
        for pid in [self.parent, self.child] {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
        self.wait_gone(Duration::from_secs(10));
    }

    fn checkpoint(&self, env: &Env, tag: &str) {
        let pid = self.parent.to_string();
        env.json(&["checkpoint", "--pid", &pid, "--tag", tag, "--criu", CRIU]);
        self.wait_gone(Duration::from_secs(10));
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        for pid in [self.parent, self.child] {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&*self.dir.path().to_string_lossy()) {
                let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
        }
    }
}

#[test]
fn a_tree_comes_back_with_every_page_and_a_child_forked_during_the_fill_sees_them_too() {
    let env = Env::new(&[]);
    let tree = Tree::start(320);
    tree.checkpoint(&env, "tree:1");
    // Asked before the restore, so the parent forks as soon as it runs, while memory is filled.
    std::fs::write(tree.out("fork"), "").unwrap();
    let r = env.json(&["restore", "tree:1", "--run", "--criu", CRIU]);
    assert_eq!(r["mode"], "lazy", "{r}");
    assert_eq!(r["pid"].as_u64(), Some(tree.parent as u64));
    let fill = &r["fill"];
    assert_eq!(fill["tasks"], 2, "{r}");
    assert!(fill["lazy_bytes"].as_u64().unwrap() > 400 << 20, "{r}");
    assert!(fill["forked"].as_u64().unwrap() >= 1, "the fork came after the fill: {r}");
    let forked = tree.wait_file("result-forked", Duration::from_secs(60));
    assert_eq!(forked, std::fs::read_to_string(tree.out("ready-parent")).unwrap(), "the forked child's memory differs");
    tree.assert_intact("parent");
    tree.assert_intact("child");

    // Many restores in a row: checkpoint the restored tree again and bring it back, twice.
    for round in 2..=3 {
        let tag = format!("tree:{round}");
        tree.checkpoint(&env, &tag);
        let r = env.json(&["restore", &tag, "--run", "--criu", CRIU]);
        assert_eq!(r["mode"], "lazy", "{r}");
        tree.assert_intact("parent");
        tree.assert_intact("child");
    }
    // The eager path stays.
    tree.checkpoint(&env, "tree:eager");
    let r = env.json(&["restore", "tree:eager", "--run", "--no-lazy", "--criu", CRIU]);
    assert_eq!(r["mode"], "eager", "{r}");
    assert!(r["fill"].is_null() && r["eager_reason"].is_null(), "{r}");
    tree.assert_intact("parent");
    tree.assert_intact("child");
}

/// The restore profiles in the store: (path, JSON).
fn profiles(env: &Env) -> Vec<(PathBuf, serde_json::Value)> {
    let json = |p: &Path| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap_or_default();
    files_below(&env.store.join("profiles"))
        .into_iter()
        .map(|p| {
            let j = json(&p);
            (p, j)
        })
        .collect()
}

#[test]
fn a_second_checkpoint_stored_as_deltas_comes_back_lazily_with_the_changed_pages() {
    let env = Env::new(&[]);
    let tree = Tree::start(64);
    let pid = tree.parent.to_string();
    env.json(&["checkpoint", "--pid", &pid, "--tag", "tree:1", "--leave-running", "--criu", CRIU]);
    // The parent rewrites 200 scattered pages; its second checkpoint stores the chunks holding
    // them as deltas against the first's.
    // Written whole, then renamed into place: the tree polls for the file and reads it at once
    // (an empty file read mid-write ended the parent with a ValueError on a loaded machine).
    std::fs::write(tree.out("touch-parent.tmp"), "200").unwrap();
    std::fs::rename(tree.out("touch-parent.tmp"), tree.out("touch-parent")).unwrap();
    let touched = tree.wait_file("touched-parent", Duration::from_secs(60));
    let second = env.json(&["checkpoint", "--pid", &pid, "--tag", "tree:2", "--criu", CRIU]);
    tree.wait_gone(Duration::from_secs(10));
    let deltas = second["push"]["delta_chunks"].as_u64().unwrap();
    assert!(deltas >= 20, "{second}");
    let r = env.json(&["restore", "tree:2", "--run", "--criu", CRIU]);
    assert_eq!(r["mode"], "lazy", "{r}");
    let _ = std::fs::remove_file(tree.out("result-parent"));
    std::fs::write(tree.out("go-parent"), "").unwrap();
    assert_eq!(tree.wait_file("result-parent", Duration::from_secs(60)), touched, "the parent's memory differs");
    tree.assert_intact("child");
}

#[test]
fn a_restore_profile_is_recorded_then_followed_and_goes_with_its_image() {
    let env = Env::new(&[]);
    let tree = Tree::start(200);
    tree.checkpoint(&env, "tree:1");
    let restore = || env.json(&["restore", "tree:1", "--run", "--criu", CRIU]);
    let r = restore();
    assert_eq!(r["profile"], "recorded a profile for the next restore", "{r}");
    assert_eq!(r["fill"]["used_profile"], false, "{r}");
    let stored = profiles(&env);
    assert_eq!(stored.len(), 1, "{stored:?}");
    let (path, profile) = &stored[0];
    let order = profile["order"].as_array().expect("an order");
    assert!(!order.is_empty(), "{profile}");
    let pids = [tree.parent as u64, tree.child as u64];
    assert!(order.iter().all(|e| pids.contains(&e[0].as_u64().unwrap())), "{profile}");

    // The next restore follows it.
    tree.kill();
    let r = restore();
    assert_eq!(r["profile"], "followed the stored profile", "{r}");
    assert_eq!(r["fill"]["used_profile"], true, "{r}");
    tree.assert_intact("parent");
    tree.assert_intact("child");

    // A damaged profile is only a lost hint: the restore is whole, and a new profile is stored.
    tree.kill();
    std::fs::write(path, br#"{"format": 9, "segment_bytes": 2097152, "order": []}"#).unwrap();
    let r = restore();
    let note = r["profile"].as_str().unwrap_or_default();
    assert!(note.starts_with("the stored profile is unreadable") && note.contains("format 9"), "{r}");
    assert!(note.ends_with("recorded a profile for the next restore"), "{r}");
    tree.assert_intact("parent");
    tree.assert_intact("child");
    assert_eq!(profiles(&env)[0].1["format"], 1);

    // gc deletes it with its image: one run's first pass tombstones the manifest, the second
    // deletes both.
    tree.kill();
    env.ok(&["rm", "tree:1"]);
    let r = env.json(&["gc"]);
    assert_eq!((r["manifests_deleted"].as_u64(), r["passes"].as_u64()), (Some(1), Some(2)), "{r}");
    assert!(profiles(&env).is_empty());
}

/// The recorded plans (`index.plans/`), sorted, each with when it was last written.
fn plans(env: &Env) -> Vec<(PathBuf, std::time::SystemTime)> {
    files_below(&env.store.join("index.plans"))
        .into_iter()
        .map(|p| (p.clone(), p.metadata().unwrap().modified().unwrap()))
        .collect()
}

#[test]
fn a_checkpoint_records_where_its_lazy_memory_is_stored_and_restores_read_that_record() {
    let env = Env::new(&[]);
    let tree = Tree::start(200);
    tree.checkpoint(&env, "tree:1");
    // The checkpoint recorded where each process's lazy memory is; the first restore adds the
    // plan of the image files it writes out.
    let before = plans(&env);
    assert_eq!(before.len(), 2, "{before:?}");
    let restore = || env.json(&["restore", "tree:1", "--run", "--criu", CRIU]);
    let r = restore();
    assert_eq!(r["mode"], "lazy", "{r}");
    tree.assert_intact("parent");
    tree.assert_intact("child");
    let recorded = plans(&env);
    assert_eq!(recorded.len(), 3, "{before:?} then {recorded:?}");
    assert!(before.iter().all(|p| recorded.contains(p)), "the first restore wrote the checkpoint's records again");

    // The next restore finds every location in the records: none is written again.
    tree.kill();
    let r = restore();
    assert_eq!(r["mode"], "lazy", "{r}");
    tree.assert_intact("parent");
    tree.assert_intact("child");
    assert_eq!(plans(&env), recorded, "a restore of an unchanged store wrote its plans again");

    // A record names where a chunk is, not what it holds: damage there is still caught.
    tree.kill();
    let chunk = damage_a_lazy_chunk(&env, "tree:1");
    let o = env.run(&["restore", "tree:1", "--run", "--criu", CRIU]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(4), "damage exits 4: {err}");
    assert!(err.contains(&chunk) && err.contains("corrupt chunk"), "{err}");
    tree.wait_gone(Duration::from_secs(5));
}

#[test]
fn a_tree_checkpointed_into_s3_comes_back_lazily_on_another_machine_and_its_profile_is_stored() {
    let s3 = S3::start();
    s3.ok("a", &["init"]);
    let tree = Tree::start(200);
    let pid = tree.parent.to_string();
    s3.ok("a", &["checkpoint", "--pid", &pid, "--tag", "tree:s3", "--criu", CRIU]);
    tree.wait_gone(Duration::from_secs(10));
    let restore = || -> serde_json::Value {
        serde_json::from_str(&s3.ok("b", &["--json", "restore", "tree:s3", "--run", "--criu", CRIU])).unwrap()
    };
    let r = restore();
    assert_eq!(
        (r["mode"].as_str(), r["profile"].as_str()),
        (Some("lazy"), Some("recorded a profile for the next restore")),
        "{r}"
    );
    tree.assert_intact("parent");
    tree.assert_intact("child");
    let stored = files_below(&s3.bucket_dir().join("images/profiles"));
    assert_eq!(stored.len(), 1, "{stored:?}");
    tree.kill();
    let r = restore();
    assert_eq!(r["profile"], "followed the stored profile", "{r}");
    tree.assert_intact("parent");
    tree.assert_intact("child");
}

/// Damages a chunk in the middle of the image's largest pages file.
fn damage_a_lazy_chunk(env: &Env, tag: &str) -> String {
    damage_a_chunk(env, tag, |path| path.starts_with("pages-"))
}

#[test]
fn a_damaged_chunk_mid_fill_kills_the_restored_tree_and_names_the_chunk() {
    damaged_chunk_mid_fill(&[]);
}

/// In a store of raw chunks (`--min-saving 100`) the fill copies them into the process
/// straight from the packs, checked in place: the tree comes back whole, and a damaged chunk
/// is caught there too.
#[test]
fn a_store_of_raw_chunks_fills_straight_from_its_packs_and_catches_damage_there() {
    let env = Env::new(&["--min-saving", "100"]);
    let tree = Tree::start(200);
    tree.checkpoint(&env, "tree:1");
    let r = env.json(&["restore", "tree:1", "--run", "--criu", CRIU]);
    assert_eq!(r["mode"], "lazy", "{r}");
    tree.assert_intact("parent");
    tree.assert_intact("child");
    tree.kill();
    damaged_chunk_mid_fill(&["--min-saving", "100"]);
}

/// A tree checkpointed into a store made with `init` and restored after a chunk of its
/// largest pages file was damaged: the restore fails naming the chunk and kills the tree.
fn damaged_chunk_mid_fill(init: &[&str]) {
    let env = Env::new(init);
    let tree = Tree::start(200);
    tree.checkpoint(&env, "tree:1");
    let chunk = damage_a_lazy_chunk(&env, "tree:1");
    let o = env.run(&["restore", "tree:1", "--run", "--criu", CRIU]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(4), "damage exits 4: {err}");
    assert!(err.contains("tree:1") && err.contains(&chunk) && err.contains("corrupt chunk"), "{err}");
    assert!(err.contains("were killed"), "{err}");
    tree.wait_gone(Duration::from_secs(5));
}

#[test]
fn a_daemon_killed_mid_fill_leaves_no_process_running() {
    let env = Env::new(&[]);
    let tree = Tree::start(320);
    tree.checkpoint(&env, "tree:1");
    let server = Server::start(&env.store, &[]);
    let slow = slow_link(&server);
    let mut restore = server.cmd_via(&slow.url, "node", "", &["--json", "restore", "tree:1", "--run", "--criu", CRIU]);
    let mut restore = restore.stdout(std::process::Stdio::piped()).spawn().unwrap();
    // Once the restored parent exists, the fill is under way: freeze the store, kill gstore.
    let server_pid = freeze_the_store_once_restoring(&tree, &server, &mut restore);
    let finished = restore.try_wait().unwrap();
    restore.kill().unwrap();
    restore.wait().unwrap();
    Command::new("kill").args(["-CONT", &server_pid]).status().unwrap();
    eprintln!("gstore had ended before it was killed: {finished:?}");
    match finished {
        // The fill won the race: then the memory must be complete.
        Some(status) if status.success() => {
            tree.assert_intact("parent");
            tree.assert_intact("child");
        }
        _ => tree.wait_gone(Duration::from_secs(5)),
    }
}

#[test]
fn a_store_server_killed_mid_fill_kills_the_restored_tree_and_says_what_failed() {
    let env = Env::new(&[]);
    let tree = Tree::start(320);
    tree.checkpoint(&env, "tree:1");
    let server = Server::start(&env.store, &[]);
    let slow = slow_link(&server);
    let mut restore = server.cmd_via(&slow.url, "node", "", &["restore", "tree:1", "--run", "--criu", CRIU]);
    // Retries give up after 3 s rather than the default minute.
    let mut restore = restore.env("GSTORE_RETRY_TIMEOUT", "3s").stderr(std::process::Stdio::piped()).spawn().unwrap();
    // The restored parent exists while CRIU still restores: no lazy page has been filled in
    // the background yet. Freeze the server there, then kill it.
    let server_pid = freeze_the_store_once_restoring(&tree, &server, &mut restore);
    Command::new("kill").args(["-KILL", &server_pid]).status().unwrap();
    let out = restore.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the restore succeeded without its store: {err}");
    assert!(err.contains("restoring the process of tree:1 failed"), "{err}");
    assert!(err.contains("fetching chunk") && err.contains("pages-"), "{err}");
    assert!(err.contains("were killed"), "{err}");
    tree.wait_gone(Duration::from_secs(5));
}

/// A proxy in front of `server` moving 1 MB/s, so that a fill stopped once the restored parent
/// exists is always stopped mid-fill: on the loopback link a loaded machine could see the whole
/// fill done (the tree's pages compress well) before the test acted, and a test asserting that
/// a killed fill kills the tree then failed, as the tree rightly ran on (a fill stopped 3 s
/// after the parent appeared is still midway at this rate).
fn slow_link(server: &Server) -> SlowLink {
    server.slow_link(1_000_000)
}

/// Waits until the restored parent exists (CRIU is still restoring it: no lazy page has been
/// filled in the background yet), then freezes the store server (SIGSTOP); returns its pid.
fn freeze_the_store_once_restoring(tree: &Tree, server: &Server, restore: &mut std::process::Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !Tree::alive(tree.parent) {
        assert!(Instant::now() < deadline, "the tree was never restored");
        assert!(restore.try_wait().unwrap().is_none(), "gstore ended before the tree was restored");
        std::thread::sleep(Duration::from_millis(1));
    }
    let server_pid = server.pid().to_string();
    Command::new("kill").args(["-STOP", &server_pid]).status().unwrap();
    server_pid
}
