//! Request bodies on their way to the filer: counted, hashed against `Content-MD5`, and failed
//! (so the filer commits nothing) when they are short, broken or do not match.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use md5::{Digest, Md5};
use s3s::dto::StreamingBlob;
use s3s::{S3Error, S3ErrorCode};

use tidemark_core::ByteStream;

/// What went wrong with a body, if anything; read after the filer's write returned.
#[derive(Clone, Default)]
pub struct Verdict(Arc<Mutex<Option<S3Error>>>);

impl Verdict {
    fn set(&self, e: S3Error) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }
    pub fn take(&self) -> Option<S3Error> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// A request body as the filer's stream.
pub fn from_request(body: Option<StreamingBlob>) -> ByteStream {
    match body {
        Some(b) => tidemark_core::filer::idle_limited(
            b.map(|r| r.map_err(|e| std::io::Error::other(e.to_string()))).boxed(),
            tidemark_core::filer::body_idle_limit(),
        ),
        None => futures::stream::empty().boxed(),
    }
}

/// A filer's stream as a response body (s3s wants a `Sync` stream; the filer's is only `Send`).
pub fn to_response(stream: ByteStream) -> StreamingBlob {
    StreamingBlob::wrap(sync_wrapper::SyncStream::new(stream))
}

/// Decodes a `Content-MD5` header (base64 of 16 bytes).
pub fn parse_content_md5(v: &str) -> Result<[u8; 16], S3Error> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(v.trim())
        .map_err(|_| S3Error::with_message(S3ErrorCode::InvalidDigest, "Content-MD5 is not base64"))?;
    raw.try_into().map_err(|_| S3Error::with_message(S3ErrorCode::InvalidDigest, "Content-MD5 is not 16 bytes"))
}

/// `body` as the filer's stream. With `expected_md5`, `expected_len` or a checksum to check
/// (`sums`), the stream fails at its end when the bytes do not match, before the filer could
/// commit them.
pub fn checked(
    inner: ByteStream,
    expected_md5: Option<[u8; 16]>,
    expected_len: Option<u64>,
    sums: Option<crate::checksum::Check>,
) -> (ByteStream, Verdict) {
    let verdict = Verdict::default();
    let v = verdict.clone();
    struct State {
        inner: futures::stream::BoxStream<'static, Result<Bytes, std::io::Error>>,
        md5: Md5,
        len: u64,
        sums: Option<crate::checksum::Check>,
        done: bool,
    }
    let state = State { inner, md5: Md5::new(), len: 0, sums, done: false };
    let stream = futures::stream::unfold(state, move |mut s| {
        let v = v.clone();
        async move {
            if s.done {
                return None;
            }
            match s.inner.next().await {
                Some(Ok(chunk)) => {
                    s.len += chunk.len() as u64;
                    if expected_md5.is_some() {
                        s.md5.update(&chunk);
                    }
                    if let Some(c) = &mut s.sums {
                        c.update(&chunk);
                    }
                    if expected_len.is_some_and(|n| s.len > n) {
                        s.done = true;
                        v.set(S3Error::with_message(
                            S3ErrorCode::InvalidRequest,
                            "the body is longer than its Content-Length",
                        ));
                        return Some((Err(std::io::Error::other("body longer than declared")), s));
                    }
                    Some((Ok(chunk), s))
                }
                Some(Err(e)) => {
                    s.done = true;
                    // S3's own answer to a body that stops: RequestTimeout (400).
                    v.set(if e.kind() == std::io::ErrorKind::TimedOut {
                        S3Error::with_message(
                            S3ErrorCode::RequestTimeout,
                            format!("{e} (after {} bytes); nothing was stored, send it again", s.len),
                        )
                    } else {
                        S3Error::with_message(
                            S3ErrorCode::IncompleteBody,
                            format!("the request body broke off after {} bytes: {e}", s.len),
                        )
                    });
                    Some((Err(e), s))
                }
                None => {
                    s.done = true;
                    if let Some(n) = expected_len
                        && s.len != n
                    {
                        v.set(S3Error::with_message(
                            S3ErrorCode::IncompleteBody,
                            format!("the body has {} bytes, Content-Length said {n}", s.len),
                        ));
                        return Some((Err(std::io::Error::other("short body")), s));
                    }
                    if let Some(want) = expected_md5 {
                        let got: [u8; 16] = s.md5.clone().finalize().into();
                        if got != want {
                            v.set(S3Error::with_message(
                                S3ErrorCode::BadDigest,
                                "the Content-MD5 you specified did not match what we received",
                            ));
                            return Some((Err(std::io::Error::other("Content-MD5 mismatch")), s));
                        }
                    }
                    if let Some(Err(e)) = s.sums.as_mut().map(crate::checksum::Check::finish) {
                        v.set(e);
                        return Some((Err(std::io::Error::other("checksum mismatch")), s));
                    }
                    None
                }
            }
        }
    });
    (stream.boxed(), verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that stops sending is S3's RequestTimeout, one that breaks is IncompleteBody.
    #[tokio::test]
    async fn a_body_that_stalls_is_s3s_request_timeout() {
        for (kind, code) in [
            (std::io::ErrorKind::TimedOut, S3ErrorCode::RequestTimeout),
            (std::io::ErrorKind::Other, S3ErrorCode::IncompleteBody),
        ] {
            let inner =
                futures::stream::iter(vec![Ok(Bytes::from_static(b"ten bytes!")), Err(std::io::Error::new(kind, "x"))]);
            let (mut s, verdict) = checked(inner.boxed(), None, Some(1000), None);
            while s.next().await.is_some() {}
            assert_eq!(verdict.take().map(|e| e.code().clone()), Some(code));
        }
    }
}
