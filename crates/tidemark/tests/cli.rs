//! The `tidemark` binary as a user runs it: the quick start, the shell's one-shot and script
//! modes, its errors, and the filer's refusals.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use tidemark_testkit::{TidemarkProcess, free_port, run_shell};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn no_panic(o: &Output) {
    let err = text(&o.stderr);
    assert!(!err.contains("panicked"), "panic: {err}");
}

fn ok(o: Output) -> String {
    no_panic(&o);
    assert!(o.status.success(), "failed ({:?}): {}", o.status, text(&o.stderr));
    text(&o.stdout)
}

fn fails(o: Output) -> String {
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "should fail: stdout {} stderr {}", text(&o.stdout), text(&o.stderr));
    text(&o.stderr)
}

#[test]
fn quick_start_put_ls_cat() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let readme = tmp.path().join("README.md");
    let content = "# Tidemark\nkeeps a namespace in sync with a bucket.\n".repeat(50);
    std::fs::write(&readme, &content).unwrap();
    let out = ok(run_shell(
        bin(),
        &server.addr,
        &format!("fs.put {} /docs/readme.md; fs.ls -l /docs; fs.cat /docs/readme.md", readme.display()),
        &[],
    ));
    let listing = out.lines().find(|l| l.ends_with(" readme.md")).unwrap_or_else(|| panic!("no listing in {out}"));
    assert!(listing.starts_with("-rw-r--r--"), "{listing}");
    assert!(listing.contains(&format!(" {} ", content.len())), "size in {listing}");
    assert!(out.ends_with(&content), "fs.cat prints the bytes");

    let meta = ok(run_shell(bin(), &server.addr, "fs.meta.cat /docs/readme.md", &[]));
    let json: serde_json::Value = serde_json::from_str(&meta).unwrap();
    assert_eq!(json["size"], content.len());
    assert_eq!(json["kind"], "file");

    // The system directory holds the cluster's own documents (where its content lives) from start.
    let root = ok(run_shell(bin(), &server.addr, "fs.ls /", &[]));
    assert_eq!(root.trim(), "docs/\netc/");
}

#[test]
fn large_files_round_trip_and_directories_take_the_file_name() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let big: Vec<u8> = (0..5_000_000u32).map(|i| (i % 253) as u8).collect();
    let local = tmp.path().join("big.bin");
    std::fs::write(&local, &big).unwrap();
    ok(run_shell(bin(), &server.addr, &format!("fs.put {} /data/", local.display()), &[]));
    let out =
        Command::new(bin()).args(["shell", "--filer", &server.addr, "-c", "fs.cat /data/big.bin"]).output().unwrap();
    assert!(out.status.success());
    assert!(out.stdout == big, "5 MB came back intact ({} bytes)", out.stdout.len());
}

#[test]
fn shell_errors_print_usage_and_exit_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let a = &server.addr;

    let err = fails(run_shell(bin(), a, "fs.nope /x", &[]));
    assert!(err.contains("unknown command \"fs.nope\"") && err.contains("commands:") && err.contains("fs.ls"), "{err}");

    let err = fails(run_shell(bin(), a, "fs.ls -bogus /", &[]));
    assert!(err.contains("unknown flag -bogus") && err.contains("usage: fs.ls [-l] [PATH]"), "{err}");

    let err = fails(run_shell(bin(), a, "fs.cat", &[]));
    assert!(err.contains("missing argument") && err.contains("usage: fs.cat PATH"), "{err}");

    let err = fails(run_shell(bin(), a, "fs.cat /a /b", &[]));
    assert!(err.contains("unexpected argument \"/b\""), "{err}");

    let err = fails(run_shell(bin(), a, "fs.ls relative/path", &[]));
    assert!(err.contains("must be absolute"), "{err}");

    let err = fails(run_shell(bin(), a, "fs.cat '/unterminated", &[]));
    assert!(err.contains("unterminated"), "{err}");

    let err = fails(run_shell(bin(), a, "fs.cat /missing", &[]));
    assert!(err.contains("/missing: no such entry"), "{err}");

    // One-shot mode stops at the first failure: the second command never runs.
    let file = tmp.path().join("f.txt");
    std::fs::write(&file, "x").unwrap();
    fails(run_shell(bin(), a, &format!("fs.cat /missing; fs.put {} /after", file.display()), &[]));
    fails(run_shell(bin(), a, "fs.cat /after", &[]));

    let err = fails(run_shell(bin(), a, "fs.put /no/such/local/file /x", &[]));
    assert!(err.contains("/no/such/local/file"), "{err}");

    let help = ok(run_shell(bin(), a, "help fs.put", &[]));
    assert!(help.contains("usage: fs.put LOCALFILE PATH"), "{help}");
    fails(run_shell(bin(), a, "help fs.nope", &[]));
}

#[test]
fn commands_from_stdin_run_as_a_script() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let file = tmp.path().join("s.txt");
    std::fs::write(&file, "scripted").unwrap();
    let mut child = Command::new(bin())
        .args(["shell", "--filer", &server.addr])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script = format!("# a comment\nfs.put {} /s/one\n\nfs.cat /s/one\n", file.display());
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), script.as_bytes()).unwrap();
    drop(child.stdin.take());
    let out = ok(child.wait_with_output().unwrap());
    assert!(out.ends_with("scripted"), "{out}");
}

#[test]
fn an_unreachable_filer_is_one_clear_error() {
    let port = free_port();
    let err = fails(run_shell(bin(), &format!("127.0.0.1:{port}"), "fs.ls /", &[]));
    assert!(err.contains("cannot connect to the filer") && err.contains(&port.to_string()), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

#[test]
fn a_token_is_required_when_set_and_needed_beyond_loopback() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args(["filer", "--data-dir"])
        .arg(tmp.path().join("d"))
        .args(["--addr", "0.0.0.0:0"])
        .env_remove("TIDEMARK_TOKEN")
        .output()
        .unwrap();
    no_panic(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("without a token"), "{}", text(&out.stderr));

    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &["--token", "s3cret"]);
    let err = fails(run_shell(bin(), &server.addr, "fs.ls /", &[]));
    assert!(err.contains("unauthorized") && err.contains("TIDEMARK_TOKEN"), "{err}");
    ok(run_shell(bin(), &server.addr, "fs.ls /", &[("TIDEMARK_TOKEN", "s3cret")]));
}

#[test]
fn a_data_directory_serves_one_process_and_bad_store_urls_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let _first = TidemarkProcess::server(bin(), &data, &[]);
    let out = Command::new(bin())
        .args(["server", "--data-dir"])
        .arg(&data)
        .args(["--filer-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--s3-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    no_panic(&out);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("in use by another tidemark process"), "{}", text(&out.stderr));

    for (store, says) in [("postgres://localhost/db", "PostgreSQL"), ("mysql://x", "unknown --store")] {
        let out = Command::new(bin())
            .args(["filer", "--data-dir"])
            .arg(tmp.path().join("other"))
            .args(["--addr", "127.0.0.1:0", "--store", store])
            .output()
            .unwrap();
        no_panic(&out);
        assert!(!out.status.success());
        assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
    }
}

#[test]
fn sigterm_stops_the_server_cleanly_and_data_survives_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut server = TidemarkProcess::server(bin(), &data, &[]);
    let file = tmp.path().join("keep.txt");
    std::fs::write(&file, "kept").unwrap();
    ok(run_shell(bin(), &server.addr, &format!("fs.put {} /keep.txt", file.display()), &[]));
    let status = Command::new("kill").args(["-TERM", &server.pid().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = server.wait_exit(std::time::Duration::from_secs(10)).expect("the server exits on SIGTERM");
    assert!(exit.success(), "{exit:?}: {}", server.stderr());
    let server = TidemarkProcess::server(bin(), &data, &[]);
    assert_eq!(ok(run_shell(bin(), &server.addr, "fs.cat /keep.txt", &[])), "kept");
}

#[test]
fn the_admin_requires_the_token_it_was_given() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &["--token", "s3cret"]);
    let code = |auth: &[&str]| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(auth)
            .arg(format!("http://{}/api/v1/health", server.admin_addr))
            .output()
            .unwrap();
        text(&out.stdout)
    };
    assert_eq!(code(&[]), "401");
    assert_eq!(code(&["-H", "Authorization: Bearer wrong"]), "401");
    assert_eq!(code(&["-H", "Authorization: Bearer s3cret"]), "200");
    assert_eq!(code(&["-u", "anyone:s3cret"]), "200", "a browser's Basic authentication");
    // The server's own worker got in: it registered with the token.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !server.stderr().contains("registered with the admin") {
        assert!(std::time::Instant::now() < deadline, "{}", server.stderr());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn help_explains_every_role() {
    let out = ok(Command::new(bin()).arg("--help").output().unwrap());
    for role in ["filer", "server", "admin", "worker", "shell"] {
        assert!(out.contains(role), "{out}");
    }
    let out = ok(Command::new(bin()).args(["server", "--help"]).output().unwrap());
    for flag in ["--data-dir", "--filer-addr", "--admin-addr", "--local-bucket", "--token"] {
        assert!(out.contains(flag), "{flag}: {out}");
    }
    let out = ok(Command::new(bin()).args(["worker", "--help"]).output().unwrap());
    for flag in ["--admin", "--filer", "--max-execute", "--lease-ttl"] {
        assert!(out.contains(flag), "{flag}: {out}");
    }
    let out = ok(Command::new(bin()).args(["admin", "--help"]).output().unwrap());
    assert!(out.contains("--filer") && out.contains("--addr") && out.contains("--worker-timeout"), "{out}");
    // Beyond loopback without a token: refused, with the fix named.
    let out = Command::new(bin()).args(["admin", "--addr", "0.0.0.0:0"]).env_remove("TIDEMARK_TOKEN").output().unwrap();
    no_panic(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--token"), "{}", text(&out.stderr));
    let out = Command::new(bin()).args(["worker", "--max-execute", "0"]).output().unwrap();
    assert!(!out.status.success() && text(&out.stderr).contains("--max-execute"), "{}", text(&out.stderr));
    let out = Command::new(bin()).args(["server", "--bogus"]).output().unwrap();
    no_panic(&out);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--bogus"));
}

fn decode(provider: &str, input: &str) -> (Option<i32>, serde_json::Value) {
    let mut child = Command::new(bin())
        .args(["events", "decode", "--provider", provider])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), input.as_bytes()).unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    no_panic(&out);
    (out.status.code(), serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("JSON: {}", text(&out.stdout))))
}

#[test]
fn events_decode_prints_json_and_exits_2_for_malformed() {
    let s3 = r#"{"Records":[{"eventVersion":"2.1","eventSource":"aws:s3","eventTime":"2026-12-02T10:00:00.000Z",
        "eventName":"ObjectRemoved:Delete","s3":{"bucket":{"name":"b"},"object":{"key":"a+b%2Fc.txt"}}}]}"#;
    let (code, v) = decode("s3", s3);
    assert_eq!(code, Some(0));
    assert_eq!(v["kind"], "events");
    assert_eq!(v["events"][0]["key"], "a b/c.txt");
    assert_eq!(v["events"][0]["kind"], "removed");
    assert_eq!(v["events"][0]["event_time"], "2026-12-02T10:00:00.000Z");

    let (code, v) = decode("s3", r#"{"Event":"s3:TestEvent"}"#);
    assert_eq!((code, v["kind"].as_str()), (Some(0), Some("test")));
    let (code, v) = decode("s3", r#"{"Type":"SubscriptionConfirmation"}"#);
    assert_eq!((code, v["kind"].as_str()), (Some(0), Some("ignored")));
    let (code, v) = decode("s3", "{truncated");
    assert_eq!((code, v["kind"].as_str()), (Some(2), Some("malformed")));
    assert!(v["reason"].as_str().unwrap().contains("not JSON"));

    let gcs = r#"{"data":"","attributes":{"eventType":"OBJECT_FINALIZE","bucketId":"b","objectId":"x y","payloadFormat":"NONE"}}"#;
    let (code, v) = decode("gcs", gcs);
    assert_eq!((code, v["events"][0]["key"].as_str()), (Some(0), Some("x y")));
    let (code, _) = decode(
        "gcs",
        r#"{"data":"!!!","attributes":{"eventType":"OBJECT_FINALIZE","bucketId":"b","objectId":"k","payloadFormat":"JSON_API_V1"}}"#,
    );
    assert_eq!(code, Some(2));

    let azure = r#"{"eventType":"Microsoft.Storage.BlobCreated","subject":"/blobServices/default/containers/c/blobs/k","data":{"url":"https://a.blob.core.windows.net/c/k"}}"#;
    let (code, v) = decode("azure", azure);
    assert_eq!((code, v["events"][0]["bucket"].as_str()), (Some(0), Some("c")));

    let out = Command::new(bin()).args(["events", "decode", "/no/such/file"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/no/such/file"));
}

/// A name may hold any character but `/` and NUL, escape sequences included: `fs.ls` prints them
/// escaped, so a listing cannot retitle the terminal or forge lines.
#[test]
fn control_characters_in_names_are_printed_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let local = tmp.path().join("x");
    std::fs::write(&local, "x").unwrap();
    let hostile = "/d/evil\x1b]0;pwned\x07\nforged.txt";
    let filer = tidemark_filer::HttpFiler::new(&server.addr, None).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use futures::StreamExt;
        let body = futures::stream::once(async { Ok(bytes::Bytes::from_static(b"x")) }).boxed();
        tidemark_core::Filer::write(&filer, hostile, body, Default::default()).await.unwrap();
    });
    for cmd in ["fs.ls /d", "fs.ls -l /d"] {
        let listing = ok(run_shell(bin(), &server.addr, cmd, &[]));
        assert!(!listing.contains('\x1b') && !listing.contains('\x07'), "{cmd}: {listing:?}");
        assert_eq!(listing.lines().count(), 1, "{cmd}: {listing:?}");
        assert!(listing.contains(r"evil\x1b]0;pwned\x07\x0aforged.txt"), "{cmd}: {listing:?}");
    }
}

/// `--data-token`: a user with it reads and writes files but neither reads the system documents
/// (remote secrets) nor configures remotes; the admin token still does everything, and the
/// server's own roles go on working.
#[test]
fn a_data_token_works_the_namespace_and_not_the_control_plane() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bkt");
    let server = TidemarkProcess::server(
        bin(),
        &tmp.path().join("data"),
        &["--token", "adm", "--data-token", "dat", "--local-bucket", bucket.to_str().unwrap()],
    );
    let admin = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[("TIDEMARK_TOKEN", "adm")]);
    let data = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[("TIDEMARK_TOKEN", "dat")]);
    ok(admin("remote.configure -name=s3 -type=s3 -s3.endpoint=http://127.0.0.1:9 -s3.secret_key=wJalrXUtnFEMI"));
    let local = tmp.path().join("f.txt");
    std::fs::write(&local, "mine").unwrap();
    ok(data(&format!("fs.put {} /docs/f.txt", local.display())));
    assert_eq!(ok(data("fs.cat /docs/f.txt")), "mine");
    for cmd in [
        "fs.cat /etc/tidemark/remote/s3.conf",
        "fs.ls /etc/tidemark",
        "remote.configure -name=h -type=local -local.root=/",
    ] {
        let err = fails(data(cmd));
        assert!(err.contains("unauthorized") && err.contains("/etc/tidemark"), "{cmd}: {err}");
        assert!(!err.contains("wJalrXUtnFEMI"), "{err}");
    }
    assert!(ok(admin("fs.cat /etc/tidemark/remote/s3.conf")).contains("s3"));
    // The quick start's watcher (the server's own worker, with the admin token) still applies.
    std::fs::write(bucket.join("seen.txt"), "x").unwrap();
    tidemark_testkit::eventually("the bucket's file in the namespace", || {
        data("fs.ls /buckets/bkt").status.success() && ok(data("fs.ls /buckets/bkt")).contains("seen.txt")
    });
    // Data tokens without an admin token: refused at start.
    let out = Command::new(bin())
        .args(["filer", "--data-dir"])
        .arg(tmp.path().join("d2"))
        .args(["--addr", "127.0.0.1:0", "--data-token", "x"])
        .env_remove("TIDEMARK_TOKEN")
        .output()
        .unwrap();
    no_panic(&out);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("need --token"), "{}", text(&out.stderr));
}

/// Worker ids and host names go into the admin's log lines and pages: one with a newline or an
/// escape sequence is refused at registration, with the rule.
#[test]
fn worker_ids_with_control_characters_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TidemarkProcess::server(bin(), &tmp.path().join("data"), &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let register = |id: &str, host: &str| {
        let body = serde_json::json!({"worker_id": id, "capabilities": ["remote_events"], "max_execute": 1,
                                      "host": host, "version": "x"});
        let url = format!("http://{}/api/v1/workers/register", server.admin_addr);
        rt.block_on(async { reqwest::Client::new().post(url).json(&body).send().await.unwrap() })
    };
    // The admin answers 503 until it holds its lease (a moment after start, longer under load).
    tidemark_testkit::eventually("the admin active", || register("w-ok", "host-1").status() == 200);
    for (id, host) in [("w1\n2026-12-04 INFO forged", "h"), ("w\x1b[2J", "h"), ("ok", "host\nforged")] {
        let resp = register(id, host);
        assert_eq!(resp.status(), 400, "{id:?} {host:?}");
        let text = rt.block_on(resp.text()).unwrap();
        assert!(text.contains("control character"), "{text}");
    }
    assert!(!server.stderr().contains("forged"), "{}", server.stderr());
}
