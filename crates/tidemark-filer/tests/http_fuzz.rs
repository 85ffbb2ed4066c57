//! A fuzz target for the filer's HTTP request handling, run by proptest: arbitrary methods,
//! endpoints, query strings (paths with `..`, NUL, `%`-escapes of any byte, huge numbers), `Range`
//! and `x-tidemark-extended` headers and bodies, written as raw bytes to a real listener so hyper's
//! parsing is in the loop. Every request must get an answer below 500 (the caller's fault is a
//! 4xx naming it) and the filer must keep serving: no panic, no hang, no internal error.
//!
//! `PROPTEST_CASES` bounds the run (CI keeps the default below; a longer local run:
//! `PROPTEST_CASES=20000 cargo nextest run -p tidemark-filer --test http_fuzz`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use proptest::prelude::*;
use tidemark_filer::{DataDir, LocalFiler, http};

/// One filer for every case (started once, on its own runtime thread), with a data token so
/// both credentials' paths through the API are exercised.
fn server() -> &'static str {
    static ADDR: OnceLock<String> = OnceLock::new();
    ADDR.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let dir = tempfile::tempdir().unwrap();
                let filer = Arc::new(LocalFiler::open(DataDir::open(dir.path()).unwrap()).unwrap());
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap().to_string()).unwrap();
                let tokens = http::Tokens {
                    admin: Some("adm".into()),
                    data: vec!["dat".into()],
                    cluster: Some("clu".into()),
                    cluster_file: None,
                };
                http::serve_with(listener, filer, tokens, None, std::future::pending()).await.unwrap();
                drop(dir);
            });
        });
        rx.recv().unwrap()
    })
}

fn pct(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("%{b:02X}")).collect()
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/".to_string()),
        Just("/a/../b".to_string()),
        Just("/etc/tidemark/remote/x.conf".to_string()),
        Just("%2e%2e".to_string()),
        Just("/x%00y".to_string()),
        Just("18446744073709551615".to_string()),
        Just("18446744073709551616".to_string()),
        Just("-1".to_string()),
        Just("true".to_string()),
        "/[a-z/.]{0,20}",
        "[0-9]{0,22}",
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(|b| pct(&b)),
        "/[a-z]{1,3}".prop_map(|s| format!("{s}{}", "a".repeat(5000))),
    ]
}

fn query() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("path"),
        Just("dir"),
        Just("start_after"),
        Just("limit"),
        Just("after"),
        Just("recursive"),
        Just("if_version"),
        Just("if_absent"),
        Just("mode"),
        Just("mtime_ms"),
        Just("origin"),
        Just("name"),
        Just("wait"),
        Just("wait_ms"),
    ];
    proptest::collection::vec((key, value()), 0..4).prop_map(|kv| {
        kv.into_iter()
            .map(|(k, v)| {
                // A long poll's wait is bounded by the filer (a minute); the fuzz keeps it short.
                let v = if k == "wait_ms" { "5".to_string() } else { v };
                format!("{k}={v}")
            })
            .collect::<Vec<_>>()
            .join("&")
    })
}

fn endpoint() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("/api/v1/health"),
        Just("/api/v1/entry"),
        Just("/api/v1/list"),
        Just("/api/v1/scan"),
        Just("/api/v1/count"),
        Just("/api/v1/content"),
        Just("/api/v1/apply"),
        Just("/api/v1/apply-many"),
        Just("/api/v1/entries"),
        Just("/api/v1/lease"),
        Just("/api/v1/lease/acquire"),
        Just("/api/v1/changes"),
        Just("/api/v1/cache/status"),
        Just("/api/v1/cache/fetch"),
        Just("/api/v1/cache/drop"),
        Just("/api/v1/cache/stats"),
        Just("/metrics"),
        Just("/api/v1/../v1/entry"),
        Just("//api//v1/entry"),
    ]
    .prop_map(str::to_string)
}

fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "bytes=[0-9]{0,21}-[0-9]{0,21}",
        "bytes=-[0-9]{1,5}",
        "bytes=[0-9]{1,3}-[0-9]{1,3},[0-9]{1,3}-",
        "[ -~]{0,40}",
        "[A-Za-z0-9+/=]{0,200}",
    ]
}

#[derive(Debug, Clone)]
struct Req {
    method: String,
    target: String,
    token: &'static str,
    range: Option<String>,
    extended: Option<String>,
    body: Vec<u8>,
}

fn request() -> impl Strategy<Value = Req> {
    let method = prop_oneof![
        Just("GET".to_string()),
        Just("PUT".to_string()),
        Just("POST".to_string()),
        Just("DELETE".to_string()),
        Just("HEAD".to_string()),
        Just("PATCH".to_string()),
        "[A-Z]{1,8}",
    ];
    let body = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        Just(br#"{"path":"/f","mutation":{"op":"put","entry":{"kind":"file","size":3,"mtime_ms":0,"mode":420,"content":{"type":"inline"}},"data":"YWJj"},"origin":"local"}"#.to_vec()),
        Just(br#"{"path":"/etc/tidemark/x","mutation":{"op":"delete","recursive":true},"origin":"local"}"#.to_vec()),
        Just(br#"{"paths":["/","/etc/tidemark/cluster.json"]}"#.to_vec()),
        Just(br#"{"name":"n","holder":"h","ttl_ms":18446744073709551615}"#.to_vec()),
    ];
    (
        method,
        endpoint(),
        query(),
        prop_oneof![Just("adm"), Just("dat"), Just("clu"), Just("")],
        proptest::option::of(header_value()),
        proptest::option::of(header_value()),
        body,
    )
        .prop_map(|(method, ep, q, token, range, extended, body)| Req {
            method,
            target: if q.is_empty() { ep } else { format!("{ep}?{q}") },
            token,
            range,
            extended,
            body,
        })
}

/// Sends `r` as raw bytes and returns the response's status.
fn send(addr: &str, r: &Req) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!("{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", r.method, r.target);
    if !r.token.is_empty() {
        head.push_str(&format!("Authorization: Bearer {}\r\n", r.token));
    }
    if let Some(v) = &r.range {
        head.push_str(&format!("Range: {v}\r\n"));
    }
    if let Some(v) = &r.extended {
        head.push_str(&format!("x-tidemark-extended: {v}\r\n"));
    }
    if r.body.first() == Some(&b'{') {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", r.body.len()));
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&r.body).unwrap();
    let mut out = Vec::new();
    // Read until the server closes (Connection: close); a timeout is a hang.
    s.read_to_end(&mut out).unwrap_or_else(|e| panic!("no complete answer to {r:?}: {e}"));
    let text = String::from_utf8_lossy(&out);
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok());
    status.unwrap_or_else(|| panic!("no status line for {r:?}: {text:?}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_request_gets_an_answer_below_500(r in request()) {
        let addr = server();
        let status = send(addr, &r);
        prop_assert!(status < 500, "{r:?} got {status}");
        // Still serving.
        let health = Req {
            method: "GET".into(),
            target: "/api/v1/health".into(),
            token: "adm",
            range: None,
            extended: None,
            body: Vec::new(),
        };
        prop_assert_eq!(send(addr, &health), 200);
    }
}
