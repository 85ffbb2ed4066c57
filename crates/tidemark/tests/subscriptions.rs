//! remote.events.enable / list / disable: the subscription document, its identity rules and its
//! fingerprint, as an operator uses them.

use std::path::Path;
use std::process::Output;

use tidemark_testkit::{TidemarkProcess, run_shell};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn byo_queue_subscriptions_follow_the_identity_rules() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("buckets/b")).unwrap();
    let root = tmp.path().join("buckets").display().to_string();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &["--local-root", &root]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[]);
    let ok = |cmd: &str| {
        let o = sh(cmd);
        assert!(o.status.success(), "{cmd}: {}", err(&o));
        out(&o)
    };
    ok(&format!("remote.configure -name=loc -type=local -local.root={}", tmp.path().join("buckets").display()));

    let o = sh("remote.events.enable -dir=/mnt/data -queue=q1");
    assert!(!o.status.success() && err(&o).contains("not a mount"), "{}", err(&o));
    ok("remote.mount -dir=/mnt/data -remote=loc/b");
    assert!(ok("remote.events.list").contains("no event subscriptions"));

    let first = ok("remote.events.enable -dir=/mnt/data -queue=https://sqs.example/1/q1 -events=created,removed");
    assert!(first.contains("byo_queue") && first.contains("fingerprint"), "{first}");
    let again = ok("remote.events.enable -dir=/mnt/data -queue=https://sqs.example/1/q1");
    assert!(again.contains("nothing changed"), "enabling the same identity is a no-op: {again}");

    let listed: serde_json::Value = serde_json::from_str(&ok("remote.events.list -json")).unwrap();
    let doc = &listed[0];
    assert_eq!(doc["dir"], "/mnt/data");
    assert_eq!(doc["identity"]["topology"], "byo_queue");
    assert_eq!(doc["identity"]["bucket"], "b");
    let fp1 = doc["fingerprint"].as_str().unwrap().to_string();
    assert_eq!(fp1.len(), 16);
    assert!(ok("fs.ls /etc/tidemark/remote_events/subscriptions").contains("%2Fmnt%2Fdata.json"));

    // A new identity (queue, prefix, events) on a byo queue is a new subscription: new fingerprint.
    ok("remote.events.enable -dir=/mnt/data -queue=https://sqs.example/1/q2 -prefix=photos");
    let listed: serde_json::Value = serde_json::from_str(&ok("remote.events.list -json")).unwrap();
    assert_ne!(listed[0]["fingerprint"].as_str().unwrap(), fp1);
    assert_eq!(listed[0]["identity"]["prefix"], "photos/");
    let table = ok("remote.events.list");
    assert!(
        table.starts_with("DIR\tTOPOLOGY")
            && table.contains("/mnt/data\tbyo_queue\thttps://sqs.example/1/q2\tb/photos/"),
        "{table}"
    );

    for (cmd, says) in [
        ("remote.events.enable -dir=/mnt/data -queue=q -events=deleted", "unknown event type"),
        ("remote.events.enable -dir=/mnt/data -queue=q -via=sns", "exclude each other"),
        ("remote.events.disable -dir=/mnt/other", "no event subscription"),
    ] {
        let o = sh(cmd);
        assert_eq!(o.status.code(), Some(1), "{cmd}");
        assert!(err(&o).contains(says), "{cmd}: {}", err(&o));
    }

    // A local directory needs no queue: its filesystem notifications are its events.
    let local = ok("remote.events.enable -dir=/mnt/data");
    assert!(local.contains("fs-notify"), "{local}");
    assert!(ok("remote.events.disable -dir=/mnt/data -teardown").contains("nothing in the cloud was changed"));
    assert!(ok("remote.events.list").contains("no event subscriptions"));
}
