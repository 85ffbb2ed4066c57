//! Bucket policies: the JSON policy language's common subset, evaluated on every request to a
//! bucket that has one (`s3.policy` in its entry, the document as given). `Allow` and `Deny`
//! statements name principals (`*`, or identities: a name or an ARN ending in `user/NAME`),
//! actions (`s3:GetObject`, wildcards) and resources (`arn:aws:s3:::bucket/key*`), with conditions
//! on the listing prefix, the source address, secure transport, a few request headers, the tags
//! an object has (`s3:ExistingObjectTag/KEY`) and those a put gives it (`s3:RequestObjectTag/KEY`). An
//! explicit `Deny` wins over everything; an `Allow` opens the bucket to identities (and unsigned
//! requests) beyond their own scope. A document using what is not evaluated here — another
//! condition key or operator, `NotPrincipal`, a resource of another bucket — is refused when it is
//! put, never stored to be half-applied. Pure: no I/O.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;

use s3s::{S3Error, S3ErrorCode, S3Result};

pub const ATTR_POLICY: &str = "s3.policy";

/// Condition keys evaluated here.
const KEYS: [&str; 19] = [
    "s3:x-amz-grant-read",
    "s3:x-amz-grant-write",
    "s3:x-amz-grant-read-acp",
    "s3:x-amz-grant-write-acp",
    "s3:x-amz-grant-full-control",
    "aws:referer",
    "aws:useragent",
    "s3:prefix",
    "s3:delimiter",
    "s3:max-keys",
    "aws:sourceip",
    "aws:securetransport",
    "aws:username",
    "s3:x-amz-acl",
    "s3:x-amz-server-side-encryption",
    "s3:x-amz-server-side-encryption-aws-kms-key-id",
    "s3:x-amz-server-side-encryption-customer-algorithm",
    "s3:x-amz-copy-source",
    "s3:x-amz-metadata-directive",
];

/// Condition key families whose last part is a tag's key (case kept): the tags the object has
/// (`s3:ExistingObjectTag/KEY`) and those a request gives it (`s3:RequestObjectTag/KEY`, from
/// `x-amz-tagging`).
pub const EXISTING_TAG: &str = "s3:existingobjecttag/";
pub const REQUEST_TAG: &str = "s3:requestobjecttag/";

/// A condition key as requests' values are kept: lower case, but for a tag's key.
fn condition_key(k: &str) -> String {
    for family in [EXISTING_TAG, REQUEST_TAG] {
        if let (Some(head), Some(tag)) = (k.get(..family.len()), k.get(family.len()..))
            && head.eq_ignore_ascii_case(family)
            && !tag.is_empty()
        {
            return format!("{family}{tag}");
        }
    }
    k.to_ascii_lowercase()
}

const OPERATORS: [&str; 10] = [
    "Null",
    "StringEquals",
    "StringNotEquals",
    "StringLike",
    "StringNotLike",
    "StringEqualsIgnoreCase",
    "IpAddress",
    "NotIpAddress",
    "Bool",
    "NumericLessThanEquals",
];

fn malformed(msg: impl Into<String>) -> S3Error {
    S3Error::with_message(S3ErrorCode::MalformedPolicy, msg.into())
}

fn many(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
        Value::Bool(b) => vec![b.to_string()],
        Value::Number(n) => vec![n.to_string()],
        _ => vec![],
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    allow: bool,
    /// `None`: anyone, signed or not.
    principals: Option<Vec<String>>,
    actions: Vec<String>,
    not_actions: Vec<String>,
    resources: Vec<String>,
    /// (operator, key, values)
    conditions: Vec<(String, String, Vec<String>)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    statements: Vec<Statement>,
}

impl Policy {
    /// Whether a condition names an object's existing tags: the access check then reads them.
    pub fn reads_object_tags(&self) -> bool {
        self.statements.iter().any(|st| st.conditions.iter().any(|(_, k, _)| k.starts_with(EXISTING_TAG)))
    }
}

#[derive(Deserialize)]
struct RawDoc {
    #[serde(rename = "Statement")]
    statement: Value,
}

/// Reads and checks the policy document `text` put on `bucket`.
pub fn parse(text: &str, bucket: &str) -> S3Result<Policy> {
    if text.len() > 20 * 1024 {
        return Err(malformed("a bucket policy has at most 20 KiB"));
    }
    let doc: RawDoc = serde_json::from_str(text).map_err(|e| malformed(format!("not a policy document: {e}")))?;
    let raw: Vec<Value> = match doc.statement {
        Value::Array(a) => a,
        v @ Value::Object(_) => vec![v],
        _ => return Err(malformed("Statement is a statement or a list of them")),
    };
    if raw.is_empty() {
        return Err(malformed("a policy has at least one statement"));
    }
    let mut statements = Vec::new();
    for s in raw {
        let o = s.as_object().ok_or_else(|| malformed("a statement is an object"))?;
        if o.contains_key("NotPrincipal") && o.get("Effect").and_then(Value::as_str) == Some("Allow") {
            return Err(malformed("NotPrincipal goes with Deny only (an Allow to all but some is too broad)"));
        }
        for k in o.keys() {
            if !["Sid", "Effect", "Principal", "Action", "NotAction", "Resource", "Condition"].contains(&k.as_str()) {
                return Err(S3Error::with_message(
                    S3ErrorCode::NotImplemented,
                    format!("{k} in a bucket policy is not evaluated here; nothing was stored"),
                ));
            }
        }
        let allow = match o.get("Effect").and_then(Value::as_str) {
            Some("Allow") => true,
            Some("Deny") => false,
            _ => return Err(malformed("Effect is Allow or Deny")),
        };
        let principals = match o.get("Principal") {
            Some(Value::String(s)) if s == "*" => None,
            Some(Value::Object(p)) => {
                if let Some(k) = p.keys().find(|k| *k != "AWS") {
                    return Err(S3Error::with_message(
                        S3ErrorCode::NotImplemented,
                        format!(
                            "{k} principals are not evaluated here (identities are AWS principals); nothing was stored"
                        ),
                    ));
                }
                let aws = p.get("AWS").map(many).ok_or_else(|| malformed("Principal names AWS principals or *"))?;
                if aws.iter().any(|a| a == "*") { None } else { Some(aws) }
            }
            _ => return Err(malformed("a statement needs a Principal")),
        };
        let actions = o.get("Action").map(many).unwrap_or_default();
        let not_actions = o.get("NotAction").map(many).unwrap_or_default();
        if actions.is_empty() == not_actions.is_empty() {
            return Err(malformed("a statement has Action or NotAction"));
        }
        if let Some(a) = actions.iter().chain(&not_actions).find(|a| !(a.starts_with("s3:") || *a == "*")) {
            return Err(malformed(format!("Policy has invalid action {a:?}")));
        }
        let resources = o.get("Resource").map(many).unwrap_or_default();
        if resources.is_empty() {
            return Err(malformed("a statement needs a Resource"));
        }
        let own = format!("arn:aws:s3:::{bucket}");
        if let Some(r) = resources.iter().find(|r| !(**r == own || r.starts_with(&format!("{own}/")) || *r == "*")) {
            return Err(malformed(format!(
                "Policy has invalid resource {r:?}: a policy of bucket {bucket} speaks of it"
            )));
        }
        let mut conditions = Vec::new();
        if let Some(c) = o.get("Condition") {
            let c = c.as_object().ok_or_else(|| malformed("Condition is an object"))?;
            for (op, kv) in c {
                // `…IfExists`: the operator, or true when the request has no such value.
                let base = op.strip_suffix("IfExists").filter(|b| *b != "Null").unwrap_or(op);
                if !OPERATORS.contains(&base) {
                    return Err(S3Error::with_message(
                        S3ErrorCode::NotImplemented,
                        format!("the condition operator {op} is not evaluated here; nothing was stored"),
                    ));
                }
                let kv = kv.as_object().ok_or_else(|| malformed(format!("{op}: an object of keys")))?;
                for (k, v) in kv {
                    let key = condition_key(k);
                    let tag = key.starts_with(EXISTING_TAG) || key.starts_with(REQUEST_TAG);
                    if !tag && !KEYS.contains(&key.as_str()) {
                        return Err(S3Error::with_message(
                            S3ErrorCode::NotImplemented,
                            format!("the condition key {k} is not evaluated here; nothing was stored"),
                        ));
                    }
                    conditions.push((op.clone(), key, many(v)));
                }
            }
        }
        statements.push(Statement { allow, principals, actions, not_actions, resources, conditions });
    }
    Ok(Policy { statements })
}

/// What a request is, as a policy sees it.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The identity's name; `None` for an unsigned request.
    pub principal: Option<String>,
    /// `s3:GetObject`, ...
    pub action: String,
    /// `arn:aws:s3:::bucket` or `arn:aws:s3:::bucket/key`.
    pub resource: String,
    /// Condition values this request has, by (lower-case) key.
    pub values: BTreeMap<String, String>,
    pub source_ip: Option<IpAddr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
    /// No statement speaks of the request.
    Silent,
}

/// `*` and `?` wildcards, as IAM matches them.
fn like(pattern: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (pattern.chars().collect(), s.chars().collect());
    let (mut pi, mut si, mut star, mut mark) = (0, 0, None, 0);
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn principal_matches(p: &str, name: &str) -> bool {
    p == name
        || p.rsplit_once(":user/").is_some_and(|(_, n)| n == name)
        || p.rsplit_once('/').is_some_and(|(_, n)| n == name)
}

fn in_cidr(ip: IpAddr, cidr: &str) -> bool {
    let (net, bits) = cidr.split_once('/').map_or((cidr, None), |(n, b)| (n, b.parse::<u32>().ok()));
    let Ok(net) = net.parse::<IpAddr>() else { return false };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let bits = bits.unwrap_or(32).min(32);
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
            (u32::from(a) & mask) == (u32::from(n) & mask)
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let bits = bits.unwrap_or(128).min(128);
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
            (u128::from(a) & mask) == (u128::from(n) & mask)
        }
        _ => false,
    }
}

fn condition_holds(op: &str, key: &str, values: &[String], r: &Request) -> bool {
    if matches!(op, "IpAddress" | "NotIpAddress") {
        let inside = r.source_ip.is_some_and(|ip| values.iter().any(|c| in_cidr(ip, c)));
        return if op == "IpAddress" { inside } else { !inside };
    }
    let got = r.values.get(key);
    if let Some(base) = op.strip_suffix("IfExists") {
        return got.is_none() || condition_holds(base, key, values, r);
    }
    match op {
        // "true": the request has no such value; "false": it has one.
        "Null" => values.iter().any(|v| v.eq_ignore_ascii_case(&got.is_none().to_string())),
        "StringEquals" => got.is_some_and(|g| values.iter().any(|v| v == g)),
        "StringEqualsIgnoreCase" => got.is_some_and(|g| values.iter().any(|v| v.eq_ignore_ascii_case(g))),
        "StringNotEquals" => got.is_none_or(|g| values.iter().all(|v| v != g)),
        "StringLike" => got.is_some_and(|g| values.iter().any(|v| like(v, g))),
        "StringNotLike" => got.is_none_or(|g| values.iter().all(|v| !like(v, g))),
        "Bool" => got.is_some_and(|g| values.iter().any(|v| v.eq_ignore_ascii_case(g))),
        "NumericLessThanEquals" => got
            .and_then(|g| g.parse::<f64>().ok())
            .is_some_and(|g| values.iter().filter_map(|v| v.parse::<f64>().ok()).any(|v| g <= v)),
        _ => false,
    }
}

impl Statement {
    fn applies(&self, r: &Request) -> bool {
        let who = match (&self.principals, &r.principal) {
            (None, _) => true,
            (Some(ps), Some(name)) => ps.iter().any(|p| principal_matches(p, name)),
            (Some(_), None) => false,
        };
        let action = if self.actions.is_empty() {
            !self.not_actions.iter().any(|a| like(&a.to_ascii_lowercase(), &r.action.to_ascii_lowercase()))
        } else {
            self.actions.iter().any(|a| like(&a.to_ascii_lowercase(), &r.action.to_ascii_lowercase()))
        };
        who && action
            && self.resources.iter().any(|p| like(p, &r.resource))
            && self.conditions.iter().all(|(op, k, v)| condition_holds(op, k, v, r))
    }
}

impl Policy {
    /// Whether it allows anyone at all (signed or not) something, without a condition: what
    /// GetBucketPolicyStatus calls public.
    pub fn is_public(&self) -> bool {
        self.statements.iter().any(|s| s.allow && s.principals.is_none() && s.conditions.is_empty())
    }

    /// A `Deny` that applies wins; else an `Allow` that applies; else the policy is silent.
    pub fn evaluate(&self, r: &Request) -> Decision {
        let applying: Vec<&Statement> = self.statements.iter().filter(|s| s.applies(r)).collect();
        if applying.iter().any(|s| !s.allow) {
            Decision::Deny
        } else if applying.is_empty() {
            Decision::Silent
        } else {
            Decision::Allow
        }
    }
}

/// The policy action of an S3 operation.
pub fn action_of(op: &str) -> String {
    let a = match op {
        "HeadObject" => "GetObject",
        "ListObjects" | "ListObjectsV2" | "HeadBucket" => "ListBucket",
        "ListObjectVersions" => "ListBucketVersions",
        "CopyObject" | "CreateMultipartUpload" | "UploadPart" | "UploadPartCopy" | "CompleteMultipartUpload" => {
            "PutObject"
        }
        "DeleteObjects" => "DeleteObject",
        "ListParts" => "ListMultipartUploadParts",
        "ListMultipartUploads" => "ListBucketMultipartUploads",
        "GetObjectAttributes" => "GetObject",
        "PutBucketLifecycleConfiguration" => "PutLifecycleConfiguration",
        "GetBucketLifecycleConfiguration" => "GetLifecycleConfiguration",
        "DeleteBucketLifecycle" => "PutLifecycleConfiguration",
        "PutBucketCors" | "DeleteBucketCors" => "PutBucketCORS",
        "GetBucketCors" => "GetBucketCORS",
        other => other,
    };
    format!("s3:{a}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(who: Option<&str>, action: &str, resource: &str) -> Request {
        Request {
            principal: who.map(str::to_string),
            action: action.into(),
            resource: resource.into(),
            ..Default::default()
        }
    }

    /// `…IfExists` holds where the request has no such value, and is its operator where it has.
    #[test]
    fn if_exists_conditions_hold_where_the_value_is_absent() {
        let p = parse(
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:ListBucket","Resource":"arn:aws:s3:::b","Condition":{"StringLikeIfExists":{"s3:prefix":"public/*"}}}}"#,
            "b",
        )
        .unwrap();
        let mut r = req(None, "s3:ListBucket", "arn:aws:s3:::b");
        assert_eq!(p.evaluate(&r), Decision::Allow, "no prefix asked");
        r.values.insert("s3:prefix".into(), "public/x".into());
        assert_eq!(p.evaluate(&r), Decision::Allow);
        r.values.insert("s3:prefix".into(), "private/x".into());
        assert_eq!(p.evaluate(&r), Decision::Silent);
    }

    #[test]
    fn conditions_on_object_tags_match_the_tag_key_as_written() {
        let p = parse(
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*","Condition":{"StringEquals":{"s3:ExistingObjectTag/Security":"public"}}},
                {"Effect":"Allow","Principal":"*","Action":"s3:PutObject","Resource":"arn:aws:s3:::b/*","Condition":{"StringEquals":{"S3:RequestObjectTag/team":"a"}}}]}"#,
            "b",
        )
        .unwrap();
        assert!(p.reads_object_tags());
        let req = |action: &str, values: &[(&str, &str)]| Request {
            principal: Some("alt".into()),
            action: action.into(),
            resource: "arn:aws:s3:::b/k".into(),
            values: values.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            source_ip: None,
        };
        let get = |tag: &str, v: &str| p.evaluate(&req("s3:GetObject", &[(&format!("{EXISTING_TAG}{tag}"), v)]));
        assert_eq!(get("Security", "public"), Decision::Allow);
        assert_eq!(get("Security", "private"), Decision::Silent);
        assert_eq!(get("security", "public"), Decision::Silent, "a tag's key is case-sensitive");
        assert_eq!(p.evaluate(&req("s3:GetObject", &[])), Decision::Silent, "no such tag");
        assert_eq!(p.evaluate(&req("s3:PutObject", &[("s3:requestobjecttag/team", "a")])), Decision::Allow);
        assert_eq!(p.evaluate(&req("s3:PutObject", &[("s3:requestobjecttag/team", "b")])), Decision::Silent);
        // A put's grant headers, as the bucket owner's condition on what others upload.
        let p = parse(
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:PutObject","Resource":"arn:aws:s3:::b/*","Condition":{"StringEquals":{"s3:x-amz-grant-full-control":"id=main"}}}}"#,
            "b",
        )
        .unwrap();
        assert_eq!(p.evaluate(&req("s3:PutObject", &[("s3:x-amz-grant-full-control", "id=main")])), Decision::Allow);
        assert_eq!(p.evaluate(&req("s3:PutObject", &[])), Decision::Silent);
    }

    #[test]
    fn policies_allow_deny_and_refuse_what_they_cannot_say() {
        let p = parse(
            r#"{"Version":"2012-10-17","Statement":[
                {"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/public/*"},
                {"Effect":"Allow","Principal":{"AWS":["arn:aws:iam::acct:user/alice"]},"Action":["s3:ListBucket"],
                 "Resource":"arn:aws:s3:::b","Condition":{"StringLike":{"s3:prefix":"docs/*"}}},
                {"Effect":"Deny","Principal":"*","Action":"s3:*","Resource":"arn:aws:s3:::b/secret/*"},
                {"Effect":"Deny","Principal":"*","Action":"s3:PutObject","Resource":"arn:aws:s3:::b/*",
                 "Condition":{"NotIpAddress":{"aws:SourceIp":"10.0.0.0/8"}}}]}"#,
            "b",
        )
        .unwrap();
        assert_eq!(p.evaluate(&req(None, "s3:GetObject", "arn:aws:s3:::b/public/x")), Decision::Allow);
        assert_eq!(p.evaluate(&req(None, "s3:GetObject", "arn:aws:s3:::b/other")), Decision::Silent);
        assert_eq!(p.evaluate(&req(Some("bob"), "s3:GetObject", "arn:aws:s3:::b/secret/x")), Decision::Deny);
        let mut list = req(Some("alice"), "s3:ListBucket", "arn:aws:s3:::b");
        assert_eq!(p.evaluate(&list), Decision::Silent, "no prefix: the condition does not hold");
        list.values.insert("s3:prefix".into(), "docs/2026".into());
        assert_eq!(p.evaluate(&list), Decision::Allow);
        list.principal = Some("bob".into());
        assert_eq!(p.evaluate(&list), Decision::Silent);
        let mut put = req(Some("alice"), "s3:PutObject", "arn:aws:s3:::b/x");
        put.source_ip = Some("10.1.2.3".parse().unwrap());
        assert_eq!(p.evaluate(&put), Decision::Silent);
        put.source_ip = Some("192.168.1.1".parse().unwrap());
        assert_eq!(p.evaluate(&put), Decision::Deny);
        let code = |t: &str| parse(t, "b").unwrap_err().code().clone();
        assert_eq!(code("{"), S3ErrorCode::MalformedPolicy);
        assert_eq!(
            code(
                r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::other/*"}}"#
            ),
            S3ErrorCode::MalformedPolicy
        );
        assert_eq!(
            code(
                r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*","Condition":{"StringEquals":{"s3:ExistingObjectTags/k":"v"}}}}"#
            ),
            S3ErrorCode::NotImplemented
        );
        assert_eq!(
            code(
                r#"{"Statement":{"Effect":"Allow","NotPrincipal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#
            ),
            S3ErrorCode::MalformedPolicy
        );
        assert_eq!(
            code(
                r#"{"Statement":{"Effect":"Deny","NotPrincipal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}"#
            ),
            S3ErrorCode::NotImplemented
        );
        assert!(like("s3:Get*", "s3:GetObject") && !like("s3:Get*", "s3:PutObject") && like("a?c", "abc"));
        assert!(
            in_cidr("10.1.2.3".parse().unwrap(), "10.0.0.0/8") && !in_cidr("11.0.0.1".parse().unwrap(), "10.0.0.0/8")
        );
        assert_eq!(action_of("HeadObject"), "s3:GetObject");
        let unencrypted = parse(
            r#"{"Statement":{"Effect":"Deny","Principal":"*","Action":"s3:PutObject","Resource":"arn:aws:s3:::b/*",
                "Condition":{"Null":{"s3:x-amz-server-side-encryption":"true"}}}}"#,
            "b",
        )
        .unwrap();
        let mut put = req(Some("a"), "s3:PutObject", "arn:aws:s3:::b/k");
        assert_eq!(unencrypted.evaluate(&put), Decision::Deny, "no such header: Null is true");
        put.values.insert("s3:x-amz-server-side-encryption".into(), "AES256".into());
        assert_eq!(unencrypted.evaluate(&put), Decision::Silent);
        assert_eq!(
            code(
                r#"{"Statement":{"Effect":"Allow","Principal":{"Service":"logging.s3.amazonaws.com"},"Action":"s3:PutObject","Resource":"arn:aws:s3:::b/*"}}"#
            ),
            S3ErrorCode::NotImplemented
        );
    }
}
