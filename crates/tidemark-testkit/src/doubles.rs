//! What the test doubles share: serving a router from a thread of its own, over HTTP or HTTPS,
//! and reading `application/x-www-form-urlencoded` bodies and queries.

use std::collections::BTreeMap;

use crate::TestCa;

/// Serves `app` on a free loopback port from a thread of its own (a double works the same under
/// any test, async or not) until the returned sender is dropped; returns its URL —
/// `https://127.0.0.1:PORT` with `tls`'s server certificate, else `http://`.
pub(crate) fn serve_in_thread(app: axum::Router, tls: Option<&TestCa>) -> (String, tokio::sync::oneshot::Sender<()>) {
    let acceptor =
        tls.map(|t| tidemark_http::tls::acceptor(&t.cert, &t.key).expect("the test CA's server certificate"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port for a test double");
    listener.set_nonblocking(true).expect("non-blocking");
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    let endpoint = format!("{scheme}://{}", listener.local_addr().expect("its address"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            let service = tidemark_http::tower(app);
            let _ = tidemark_http::serve(listener, service, tidemark_http::Limits::default(), acceptor, async move {
                let _ = stopped.await;
            })
            .await;
        });
    });
    (endpoint, stop)
}

/// `k=v&k2=v2`, percent-decoded (`+` is a space).
pub(crate) fn form_of(body: &[u8]) -> BTreeMap<String, String> {
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect()
}

fn percent_decode(v: &str) -> String {
    let bytes = v.replace('+', " ").into_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&String::from_utf8_lossy(&bytes[i + 1..i + 3]), 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
