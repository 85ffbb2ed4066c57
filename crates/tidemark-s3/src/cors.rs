//! Cross-origin resource sharing: a bucket's CORS rules (`s3.cors` in its entry, s3s's own type
//! as JSON) decide which web pages on other origins may call the gateway from a browser. A
//! preflight (`OPTIONS`, which s3s does not route) is answered from the rules alone, without
//! credentials, as S3 answers it; any other request that names an `Origin` gets the
//! `Access-Control-*` headers of the rule that allows it. Pure: no I/O.

use s3s::dto::{CORSConfiguration, CORSRule};
use s3s::{S3Error, S3ErrorCode, S3Result};

pub const ATTR_CORS: &str = "s3.cors";

const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "HEAD"];

fn invalid(msg: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, msg.into())
}

/// Checks a configuration as S3 does.
pub fn validate(c: &CORSConfiguration) -> S3Result<()> {
    if c.cors_rules.is_empty() || c.cors_rules.len() > 100 {
        return Err(S3Error::with_message(S3ErrorCode::MalformedXML, "a CORS configuration has 1 to 100 rules"));
    }
    for r in &c.cors_rules {
        if r.id.as_ref().is_some_and(|id| id.len() > 255) {
            return Err(invalid("a CORS rule's ID has at most 255 characters"));
        }
        if r.allowed_methods.is_empty() || r.allowed_origins.is_empty() {
            return Err(S3Error::with_message(
                S3ErrorCode::MalformedXML,
                "a CORS rule needs AllowedMethod and AllowedOrigin",
            ));
        }
        if let Some(m) = r.allowed_methods.iter().find(|m| !METHODS.contains(&m.as_str())) {
            return Err(invalid(format!("Found unsupported HTTP method in CORS config. Unsupported method is {m}")));
        }
        let patterns = r.allowed_origins.iter().chain(r.allowed_headers.iter().flatten());
        if let Some(p) = patterns.into_iter().find(|p| p.matches('*').count() > 1) {
            return Err(invalid(format!("{p:?}: a CORS origin or header may hold at most one wildcard")));
        }
    }
    Ok(())
}

/// Whether `s` matches `pattern`, where one `*` stands for any run of characters.
fn matches(pattern: &str, s: &str, ignore_case: bool) -> bool {
    let (p, s) =
        if ignore_case { (pattern.to_ascii_lowercase(), s.to_ascii_lowercase()) } else { (pattern.into(), s.into()) };
    match p.split_once('*') {
        None => p == s,
        Some((head, tail)) => s.len() >= head.len() + tail.len() && s.starts_with(head) && s.ends_with(tail),
    }
}

/// What a browser asks: from which origin, to do what, sending which headers.
#[derive(Debug, Clone)]
pub struct Asked {
    pub origin: String,
    pub method: String,
    pub headers: Vec<String>,
}

impl Asked {
    /// The headers of an `Access-Control-Request-Headers` value.
    pub fn headers_of(v: &str) -> Vec<String> {
        v.split(',').map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()).collect()
    }
}

/// The first rule that allows what is asked (S3 takes the first match).
pub fn rule_for<'a>(c: &'a CORSConfiguration, a: &Asked) -> Option<&'a CORSRule> {
    c.cors_rules.iter().find(|r| {
        r.allowed_origins.iter().any(|o| matches(o, &a.origin, false))
            && r.allowed_methods.contains(&a.method)
            && a.headers.iter().all(|h| r.allowed_headers.iter().flatten().any(|p| matches(p, h, true)))
    })
}

/// The `Access-Control-*` headers of an answer allowed by `rule`; `preflight` adds what only
/// a preflight answers (the headers allowed, how long to keep the answer).
pub fn headers(rule: &CORSRule, a: &Asked, preflight: bool) -> Vec<(&'static str, String)> {
    let any = rule.allowed_origins.iter().any(|o| o == "*");
    let mut out = vec![
        ("access-control-allow-origin", if any { "*".to_string() } else { a.origin.clone() }),
        ("access-control-allow-methods", rule.allowed_methods.join(", ")),
        ("vary", "Origin, Access-Control-Request-Headers, Access-Control-Request-Method".to_string()),
    ];
    if !any {
        out.push(("access-control-allow-credentials", "true".to_string()));
    }
    if let Some(e) = rule.expose_headers.as_ref().filter(|e| !e.is_empty()) {
        out.push(("access-control-expose-headers", e.join(", ")));
    }
    if preflight {
        if !a.headers.is_empty() {
            out.push(("access-control-allow-headers", a.headers.join(", ")));
        }
        if let Some(s) = rule.max_age_seconds {
            out.push(("access-control-max-age", s.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(methods: &[&str], origins: &[&str], headers: &[&str]) -> CORSRule {
        CORSRule {
            allowed_methods: methods.iter().map(|s| s.to_string()).collect(),
            allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
            allowed_headers: (!headers.is_empty()).then(|| headers.iter().map(|s| s.to_string()).collect()),
            expose_headers: None,
            id: None,
            max_age_seconds: Some(600),
        }
    }

    fn asked(origin: &str, method: &str, headers: &[&str]) -> Asked {
        Asked { origin: origin.into(), method: method.into(), headers: headers.iter().map(|s| s.to_string()).collect() }
    }

    /// The origins and methods of ceph/s3-tests' `test_cors_origin_response`.
    #[test]
    fn origins_methods_and_headers_match_as_s3_matches_them() {
        let c = CORSConfiguration {
            cors_rules: vec![
                rule(&["GET"], &["*suffix"], &[]),
                rule(&["GET"], &["start*end"], &[]),
                rule(&["GET"], &["prefix*"], &[]),
                rule(&["PUT"], &["*.put"], &["x-amz-*", "content-type"]),
            ],
        };
        validate(&c).unwrap();
        let ok = |o: &str, m: &str, h: &[&str]| rule_for(&c, &asked(o, m, h)).is_some();
        for o in ["foo.suffix", "startend", "start1end", "prefix", "prefix.suffix"] {
            assert!(ok(o, "GET", &[]), "{o}");
        }
        for o in ["foo.bar", "foo.suffix.get", "0start12end", "bla.prefix"] {
            assert!(!ok(o, "GET", &[]), "{o}");
        }
        assert!(!ok("foo.put", "GET", &[]) && ok("foo.put", "PUT", &[]));
        assert!(ok("foo.put", "PUT", &["x-amz-meta-a", "Content-Type"]));
        assert!(!ok("foo.put", "PUT", &["authorization"]), "a header no rule allows");
        let r = rule_for(&c, &asked("foo.put", "PUT", &["content-type"])).unwrap();
        let h = headers(r, &asked("foo.put", "PUT", &["content-type"]), true);
        assert!(h.contains(&("access-control-allow-origin", "foo.put".into())));
        assert!(h.contains(&("access-control-allow-headers", "content-type".into())));
        assert!(h.contains(&("access-control-max-age", "600".into())));
        let star = CORSConfiguration { cors_rules: vec![rule(&["GET"], &["*"], &[])] };
        let h = headers(&star.cors_rules[0], &asked("x.example", "GET", &[]), false);
        assert!(
            h.contains(&("access-control-allow-origin", "*".into()))
                && !h.iter().any(|(k, _)| *k == "access-control-allow-credentials")
        );
        let code = |c: CORSConfiguration| validate(&c).unwrap_err().code().clone();
        assert_eq!(
            code(CORSConfiguration { cors_rules: vec![rule(&["PATCH"], &["*"], &[])] }),
            S3ErrorCode::InvalidRequest
        );
        assert_eq!(
            code(CORSConfiguration { cors_rules: vec![rule(&["GET"], &["*a*"], &[])] }),
            S3ErrorCode::InvalidRequest
        );
        assert_eq!(code(CORSConfiguration { cors_rules: vec![] }), S3ErrorCode::MalformedXML);
    }
}
