//! Damaged packs and manifests: `verify` names the damaged images; `restore` of a damaged
//! image fails clearly and leaves no destination behind.

use gstore_tests::*;
use std::fs;

/// A store with two images: "good" (its own packs) and "victim" (the damaged one).
fn two_images() -> (Env, std::path::PathBuf) {
    let env = Env::new(&[]);
    let good = env.path("good");
    make_tree(&good, 1, 2_000_000);
    env.ok(&["push", good.to_str().unwrap(), "--tag", "good"]);
    let victim = env.path("victim");
    fs::create_dir_all(&victim).unwrap();
    fs::write(victim.join("data"), random_bytes(3_000_000, 77)).unwrap();
    env.ok(&["push", victim.to_str().unwrap(), "--tag", "victim"]);
    let victim_pack = newest_pack(&env);
    (env, victim_pack)
}

fn newest_pack(env: &Env) -> std::path::PathBuf {
    env.packs().into_iter().max_by_key(|p| fs::metadata(p).unwrap().modified().unwrap()).unwrap()
}

fn assert_damage_reported(env: &Env, verify_args: &[&str], expect: &str) {
    let o = env.run(verify_args);
    assert!(!o.status.success(), "verify passed on a damaged store");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("DAMAGED  victim:latest"), "{out}");
    assert!(out.contains("ok       good:latest"), "{out}");
    assert!(out.contains(expect), "expected {expect:?} in:\n{out}");
    assert!(err.contains("1 damaged image(s): victim:latest"), "{err}");
    let json: serde_json::Value =
        serde_json::from_slice(&env.run(&[&["--json"][..], verify_args].concat()).stdout).unwrap();
    let bad: Vec<&str> = json["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["ok"] == false)
        .map(|i| i["tag"].as_str().unwrap())
        .collect();
    assert_eq!(bad, ["victim:latest"]);
}

fn assert_restore_refused(env: &Env, expect: &str) {
    let dest = env.path("restored");
    let err = env.fails(&["restore", "victim", "--to", dest.to_str().unwrap()]);
    assert!(err.contains(expect), "expected {expect:?} in: {err}");
    assert!(!dest.exists(), "a failed restore left its destination behind");
    assert!(!env.path(".restored.gstore-partial").exists(), "a failed restore left its staging directory");
    // The undamaged image still restores.
    env.ok(&["restore", "good", "--to", env.path("good-out").to_str().unwrap()]);
    assert_same_tree(&env.path("good"), &env.path("good-out"));
}

#[test]
fn flipped_byte_in_pack_data() {
    let (env, pack) = two_images();
    let mut bytes = fs::read(&pack).unwrap();
    bytes[1_000_000] ^= 0x01;
    fs::write(&pack, bytes).unwrap();
    // The footer is intact, so only reading the data finds it.
    env.ok(&["verify"]);
    assert_damage_reported(&env, &["verify", "--read-data"], "BLAKE3 mismatch");
    assert_restore_refused(&env, "corrupt chunk");
}

#[test]
fn truncated_pack() {
    let (env, pack) = two_images();
    let len = fs::metadata(&pack).unwrap().len();
    fs::OpenOptions::new().write(true).open(&pack).unwrap().set_len(len / 2).unwrap();
    assert_damage_reported(&env, &["verify"], "truncated");
    assert_restore_refused(&env, "truncated");
}

#[test]
fn missing_pack() {
    let (env, pack) = two_images();
    fs::remove_file(&pack).unwrap();
    // Every open syncs the index with the store, so the lost pack's chunks are in no pack.
    assert_damage_reported(&env, &["verify"], "in no pack of the store");
    assert_restore_refused(&env, "in no pack of the store");
}

#[test]
fn damaged_manifest() {
    let (env, _) = two_images();
    let id = env.json(&["ls"]).as_array().unwrap().iter().find(|t| t["tag"] == "victim:latest").unwrap()["manifest"]
        .as_str()
        .unwrap()
        .to_string();
    let path = env.store.join(format!("manifests/{}/{id}.manifest", &id[..2]));
    let mut bytes = fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    fs::write(&path, bytes).unwrap();
    assert_damage_reported(&env, &["verify"], "BLAKE3 mismatch");
    let err = env.fails(&["restore", "victim", "--to", env.path("restored").to_str().unwrap()]);
    assert!(err.contains("corrupt manifest"), "{err}");
    assert!(!env.path("restored").exists());
    // ls still lists both, flagging the damaged one.
    let ls = env.json(&["ls"]);
    let victim = ls.as_array().unwrap().iter().find(|t| t["tag"] == "victim:latest").unwrap();
    assert!(victim["error"].as_str().unwrap().contains("corrupt manifest"), "{victim}");
}

#[test]
fn damaged_footer_is_skipped_by_index_rebuild_and_named() {
    let (env, pack) = two_images();
    let mut bytes = fs::read(&pack).unwrap();
    let n = bytes.len();
    bytes[n - 60] ^= 0xff; // inside the footer entries
    fs::write(&pack, bytes).unwrap();
    let o = env.run(&["index", "rebuild"]);
    assert!(o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("footer checksum mismatch"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_damage_reported(&env, &["verify"], "in no pack of the store");
    assert_restore_refused(&env, "in no pack of the store");
}

#[test]
fn a_damaged_index_is_replaced_by_index_rebuild() {
    let (env, _) = two_images();
    fs::write(env.store.join("index/CURRENT"), "garbage\n").unwrap();
    // Commands that need the index say what to do.
    for args in [&["restore", "good", "--to", env.path("out").to_str().unwrap()][..], &["verify"], &["du"]] {
        let err = env.fails(args);
        assert!(err.contains("cannot open the local index") && err.contains("gstore index rebuild"), "{args:?}: {err}");
    }
    // Rebuilding does not need to open it.
    let r = env.json(&["index", "rebuild"]);
    assert!(r["packs_indexed"].as_u64().unwrap() >= 2, "{r}");
    env.ok(&["verify", "--read-data"]);
    env.ok(&["restore", "victim", "--to", env.path("victim-out").to_str().unwrap()]);
    assert_same_tree(&env.path("victim"), &env.path("victim-out"));
}

/// The victim's pack with a byte flipped, then `verify --read-data`, which records the damage.
fn damaged_and_verified() -> (Env, std::path::PathBuf) {
    let (env, pack) = two_images();
    let mut bytes = fs::read(&pack).unwrap();
    bytes[1_000_000] ^= 0x01;
    fs::write(&pack, bytes).unwrap();
    let o = env.run(&["verify", "--read-data"]);
    assert!(!o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("recorded 1 damaged chunk copy in the store"), "{out}");
    assert_eq!(env.files_under("damage").len(), 1);
    (env, pack)
}

/// The store heals: verify and restore are clean, and two gc passes drop the damaged pack and
/// its record while every image stays whole.
fn assert_healed(env: &Env, damaged_pack: &std::path::Path) {
    env.ok(&["verify", "--read-data"]);
    let out = env.path("healed");
    env.ok(&["restore", "victim", "--to", out.to_str().unwrap()]);
    assert_same_tree(&env.path("victim"), &out);
    env.ok(&["gc"]);
    env.ok(&["gc"]);
    assert!(!damaged_pack.exists(), "gc kept the pack with the damaged copy");
    assert!(env.files_under("damage").is_empty(), "a damage record outlived its pack");
    env.ok(&["verify", "--read-data"]);
    let again = env.path("healed-again");
    env.ok(&["restore", "victim", "--to", again.to_str().unwrap()]);
    assert_same_tree(&env.path("victim"), &again);
    env.ok(&["restore", "good", "--to", env.path("good-again").to_str().unwrap()]);
    assert_same_tree(&env.path("good"), &env.path("good-again"));
}

#[test]
fn recorded_damage_is_healed_by_pushing_the_files_again() {
    let (env, pack) = damaged_and_verified();
    // An index rebuild keeps what the records say.
    env.ok(&["index", "rebuild"]);
    let r = env.json(&["push", env.path("victim").to_str().unwrap(), "--tag", "victim"]);
    assert!(r["new_chunks"].as_u64().unwrap() >= 1, "the damaged chunk was not stored again: {r}");
    assert_healed(&env, &pack);
}

#[test]
fn recorded_damage_is_healed_by_a_copy_from_a_good_store() {
    let (env, pack) = damaged_and_verified();
    let good = Env::new(&[]);
    good.ok(&["push", env.path("victim").to_str().unwrap(), "--tag", "victim"]);
    let r = good.json(&["copy", "victim", "--to", env.store.to_str().unwrap()]);
    assert!(r[0]["copied_chunks"].as_u64().unwrap() >= 1, "{r}");
    assert_healed(&env, &pack);
}

/// The steps: a restore that failed on the damaged copy after `verify` recorded it
/// leaves a recorded plan naming that copy; once the files are pushed again, restores of
/// both tags read the good copy (before the fix both still failed until `index rebuild`).
#[test]
fn a_plan_recorded_by_a_failed_restore_does_not_outlive_the_healing_push() {
    let (env, pack) = damaged_and_verified();
    let failed = env.run(&["restore", "victim", "--to", env.path("first").to_str().unwrap()]);
    assert_eq!(failed.status.code(), Some(4), "{}", String::from_utf8_lossy(&failed.stderr));
    env.ok(&["push", env.path("victim").to_str().unwrap(), "--tag", "victim-again"]);
    for tag in ["victim", "victim-again"] {
        let out = env.path(&format!("out-{tag}"));
        let o = env.run(&["restore", tag, "--to", out.to_str().unwrap()]);
        assert!(o.status.success(), "restore {tag} after healing: {}", String::from_utf8_lossy(&o.stderr));
        assert_same_tree(&env.path("victim"), &out);
    }
    assert_healed(&env, &pack);
}
