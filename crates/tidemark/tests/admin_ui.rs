//! The Admin UI in a real browser (Debian's headless Chromium): a screenshot of each page, and
//! assertions on the DOM it renders — the subscription row, its state and counters moving after
//! files arrive in a local bucket, the Workers page, the Content cache page, and the Job types switch.

use std::path::{Path, PathBuf};
use std::process::Command;

use tidemark_testkit::browser::browser;
use tidemark_testkit::{TidemarkProcess, eventually};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

fn dump_dom(profile: &Path, url: &str) -> String {
    tidemark_testkit::browser::dump_dom_with(profile, url, &[])
}

fn screenshot(profile: &Path, url: &str, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&file);
    // As in `dump_dom`: a start-up crash under load is tried again, twice.
    let mut out = None;
    for _ in 0..3 {
        let o = browser(profile)
            .args(["--window-size=1500,700", &format!("--screenshot={}", file.display()), url])
            .output()
            .expect("running chromium");
        let ok = o.status.success();
        out = Some(o);
        if ok {
            break;
        }
    }
    let out = out.expect("chromium ran");
    assert!(out.status.success(), "chromium --screenshot {url}: {}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&file).unwrap_or_default();
    assert!(png.len() > 5_000 && png.starts_with(b"\x89PNG"), "{}: not a real screenshot", file.display());
    file
}

/// The text (tags stripped) of the element with `data-field="FIELD"` inside the row `id="ROW"`.
fn field(dom: &str, row: &str, name: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{row}\""))?;
    let rest = &dom[at..];
    let row = &rest[..rest.find("</tr>").unwrap_or(rest.len())];
    let f = row.find(&format!("data-field=\"{name}\""))?;
    let open = row[..f].rfind('<')?;
    let tag: String = row[open + 1..].chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
    let start = f + row[f..].find('>')? + 1;
    let stop = start + row[start..].find(&format!("</{tag}>"))?;
    let mut text = String::new();
    let mut in_tag = false;
    for c in row[start..stop].chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    Some(text.trim().to_string())
}

#[test]
fn the_admin_pages_show_subscriptions_workers_and_job_types_in_a_browser() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("photos");
    let server = TidemarkProcess::server(
        bin(),
        &tmp.path().join("data"),
        &["--local-bucket", bucket.to_str().unwrap(), "--lease-ttl", "6"],
    );
    let admin = format!("http://{}", server.admin_addr);
    let profile = tmp.path().join("chromium-profile");

    // The subscription row appears, tailing, with its baseline done.
    let mut fp = String::new();
    eventually("the subscription row, tailing", || {
        let dom = dump_dom(&profile, &format!("{admin}/subscriptions"));
        let Some(at) = dom.find("id=\"sub-") else { return false };
        fp = dom[at + 8..].split('"').next().unwrap().to_string();
        field(&dom, &format!("sub-{fp}"), "state").as_deref() == Some("tailing")
    });
    let row = format!("sub-{fp}");
    // The shell asks the admin which worker runs the slice (between one slice's end and the
    // next one's start, none does: a loaded machine caught that gap once).
    let mut listed = String::new();
    eventually("the shell naming the slice's worker", || {
        let out = tidemark_testkit::run_shell(
            bin(),
            &server.addr,
            "remote.events.list",
            &[("TIDEMARK_ADMIN", &server.admin_addr)],
        );
        listed = String::from_utf8_lossy(&out.stdout).into_owned();
        listed.contains("running on")
    });
    assert!(listed.contains("running on"), "{listed}");
    let unknown =
        tidemark_testkit::run_shell(bin(), &server.addr, "remote.events.list", &[("TIDEMARK_ADMIN", "127.0.0.1:1")]);
    assert!(
        String::from_utf8_lossy(&unknown.stdout).contains("SLICE unknown"),
        "the admin unreachable is said, not fatal"
    );
    let dom = dump_dom(&profile, &format!("{admin}/subscriptions"));
    assert_eq!(field(&dom, &row, "dir").as_deref(), Some("/buckets/photos"), "{dom}");
    assert_eq!(field(&dom, &row, "topology").as_deref(), Some("byo_queue"));
    assert_eq!(field(&dom, &row, "queue").as_deref(), Some("fs-notify"));
    assert!(matches!(field(&dom, &row, "reconcile-kind").as_deref(), Some("baseline" | "gap")), "{dom}");
    assert_eq!(field(&dom, &row, "lease-generation").as_deref(), Some("1"));
    let applied = |dom: &str| field(dom, &row, "applied").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let before = applied(&dom);

    // Files arrive; the counters move on the page.
    for i in 0..3 {
        std::fs::write(bucket.join(format!("p{i}.jpg")), vec![b'x'; 100 + i]).unwrap();
    }
    eventually("the applied counter to move", || {
        applied(&dump_dom(&profile, &format!("{admin}/subscriptions"))) > before
    });
    let dom = dump_dom(&profile, &format!("{admin}/subscriptions"));
    let received: u64 = field(&dom, &row, "received").unwrap().parse().unwrap();
    assert!(received >= applied(&dom), "{dom}");
    assert_eq!(field(&dom, &row, "failed").as_deref(), Some("0"));
    screenshot(&profile, &format!("{admin}/subscriptions"), "subscriptions");

    // The Workers page lists the server's own worker, running the slice.
    let dom = dump_dom(&profile, &format!("{admin}/workers"));
    assert!(dom.contains("id=\"worker-"), "{dom}");
    assert!(dom.contains("data-field=\"state\">active<"), "{dom}");
    assert!(dom.contains("/buckets/photos"), "{dom}");
    screenshot(&profile, &format!("{admin}/workers"), "workers");

    // The Content cache page: a file read twice is one miss, then one hit. The first read's
    // chunk is written to disk after it is served: the second read waits until it is resident
    // (else it may join the fetch still in flight, which is neither).
    for i in 0..2 {
        let cat = tidemark_testkit::run_shell(bin(), &server.addr, "fs.cat /buckets/photos/p1.jpg", &[]);
        assert_eq!(cat.stdout, vec![b'x'; 101], "{}", String::from_utf8_lossy(&cat.stderr));
        if i == 0 {
            eventually("the first read's chunk resident", || {
                let dom = dump_dom(&profile, &format!("{admin}/cache"));
                field(&dom, "cache-resident", "value").is_some_and(|v| v.starts_with("101 B in 1 chunks"))
            });
        }
    }
    let dom = dump_dom(&profile, &format!("{admin}/cache"));
    assert_eq!(field(&dom, "cache-misses", "value").as_deref(), Some("1"), "{dom}");
    assert_eq!(field(&dom, "cache-hits", "value").as_deref(), Some("1"), "{dom}");
    assert_eq!(field(&dom, "cache-hit-ratio", "value").as_deref(), Some("50.0%"), "{dom}");
    assert!(field(&dom, "cache-resident", "value").is_some_and(|v| v.starts_with("101 B in 1 chunks")), "{dom}");
    screenshot(&profile, &format!("{admin}/cache"), "cache");

    // The Job types page switches remote_events off (a plain form post), and on again.
    let dom = dump_dom(&profile, &format!("{admin}/job-types"));
    assert_eq!(field(&dom, "job-type-remote_events", "state").as_deref(), Some("enabled"), "{dom}");
    screenshot(&profile, &format!("{admin}/job-types"), "job-types");
    let post_from = |enabled: &str, origin: &str| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            // An empty origin: curl sends no Origin header at all.
            .arg(if origin.is_empty() { "Origin:".to_string() } else { format!("Origin: {origin}") })
            .arg("-d")
            .arg(format!("job_type=remote_events&enabled={enabled}"))
            .arg(format!("{admin}/job-types"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Another site's page posting the form (a browser would resend Basic credentials) is refused.
    assert_eq!(post_from("false", "http://evil.example"), "403");
    assert_eq!(post_from("false", "null"), "403");
    let dom = dump_dom(&profile, &format!("{admin}/job-types"));
    assert_eq!(field(&dom, "job-type-remote_events", "state").as_deref(), Some("enabled"), "{dom}");
    // No other site may frame the pages (clickjacking), and they run no script.
    let head = Command::new("curl")
        .args(["-s", "-D", "-", "-o", "/dev/null"])
        .arg(format!("{admin}/job-types"))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).to_ascii_lowercase();
    assert!(head.contains("x-frame-options: deny") && head.contains("frame-ancestors 'none'"), "{head}");
    // The page's own form (its origin) and clients that send no Origin (scripts) are served.
    let post = |enabled: &str| assert_eq!(post_from(enabled, &admin), "303");
    post("false");
    let dom = dump_dom(&profile, &format!("{admin}/job-types"));
    assert_eq!(field(&dom, "job-type-remote_events", "state").as_deref(), Some("disabled"), "{dom}");
    eventually("the slice to end once the job type is off", || {
        let dom = dump_dom(&profile, &format!("{admin}/subscriptions"));
        dom.contains("id=\"job-type-off\"")
            && field(&dom, &row, "state").as_deref() == Some("idle")
            && field(&dom, &row, "slice").as_deref() != Some("running")
    });
    screenshot(&profile, &format!("{admin}/subscriptions"), "subscriptions-job-type-off");
    assert_eq!(post_from("true", ""), "303", "a client that sends no Origin");
    eventually("tailing again", || {
        let dom = dump_dom(&profile, &format!("{admin}/subscriptions"));
        !dom.contains("id=\"job-type-off\"") && field(&dom, &row, "state").as_deref() == Some("tailing")
    });
}
