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

/// A subscription document written past the shell's checks (a raw write through the API) with
/// durations that would overflow a deadline: its slices end *errored* with the reason, over and
/// over if need be, and the server goes on (it used to panic in a loop).
#[test]
fn a_subscription_document_with_absurd_durations_errs_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("demo");
    let data = tmp.path().join("data");
    let args = ["--local-bucket", bucket.to_str().unwrap()];
    let mut server = TidemarkProcess::server(bin(), &data, &args);
    let sh = |addr: &str, cmd: &str| {
        let o = run_shell(bin(), addr, cmd, &[]);
        assert!(o.status.success(), "{cmd}: {}", err(&o));
        out(&o)
    };
    let doc_file = tidemark_core::subscription::doc_path("/buckets/demo");
    tidemark_testkit::eventually("the quick start's subscription", || {
        run_shell(bin(), &server.addr, &format!("fs.cat {doc_file}"), &[]).status.success()
    });
    let doc = sh(&server.addr, &format!("fs.cat {doc_file}"));
    let mut doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    doc["options"]["slice_secs"] = u64::MAX.into();
    doc["options"]["gap_threshold_secs"] = (u64::MAX / 10).into();
    let raw = tmp.path().join("doc.json");
    std::fs::write(&raw, serde_json::to_vec(&doc).unwrap()).unwrap();
    sh(&server.addr, &format!("fs.put {} {doc_file}", raw.display()));
    // The slice running now read the old document; the next ones read this one.
    server.signal("TERM");
    assert!(server.wait_exit(std::time::Duration::from_secs(20)).is_some(), "{}", server.stderr());
    let server = TidemarkProcess::server(bin(), &data, &args);
    tidemark_testkit::eventually("the subscription errs with the reason", || {
        let list = sh(&server.addr, "remote.events.list -json");
        let docs: serde_json::Value = serde_json::from_str(&list).unwrap();
        docs[0]["status"]["state"] == "errored"
            && docs[0]["status"]["last_error"].as_str().is_some_and(|e| e.contains("slice_secs"))
    });
    assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
    // The shell refuses the same values before they are ever stored.
    let o = run_shell(bin(), &server.addr, "remote.events.enable -dir=/buckets/demo -slice=100000000000d", &[]);
    assert!(!o.status.success() && err(&o).contains("-slice"), "{}", err(&o));
}
