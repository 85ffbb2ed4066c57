//! Secrets inside system documents (a remote's `secret_key`, an S3 identity's secret, ...): how
//! a document is shown with them masked, and how a document written back with masks (the shell
//! reads a configuration, changes one setting, writes it whole) gets its stored secrets back —
//! never the mask itself. Pure: the filer applies it to what operators' admin tokens read and
//! write when a cluster token keeps the secrets to the cluster's own roles.

use serde_json::Value;

use crate::remote::SECRET_SETTINGS;

/// A secret as it may be shown: `****` and its last 4 characters (none of a short one).
pub fn mask(v: &str) -> String {
    let n = v.chars().count();
    if n <= 8 { "****".into() } else { format!("****{}", v.chars().skip(n - 4).collect::<String>()) }
}

fn is_secret_key(k: &str) -> bool {
    SECRET_SETTINGS.contains(&k)
}

/// Masks every string under a secret's name, at any depth.
pub fn mask_json(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                match child {
                    Value::String(s) if is_secret_key(k) => *s = mask(s),
                    other => mask_json(other),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(mask_json),
        _ => {}
    }
}

fn secrets_of<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                match child {
                    Value::String(s) if is_secret_key(k) => out.push(s),
                    other => secrets_of(other, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|c| secrets_of(c, out)),
        _ => {}
    }
}

/// Puts the stored secrets back where `new` carries their masks. A masked value that matches no
/// stored secret, or two different ones, is refused: the writer must give the secret itself.
/// Returns whether anything was restored.
pub fn unmask_json(new: &mut Value, stored: Option<&Value>) -> Result<bool, String> {
    let mut known = Vec::new();
    if let Some(s) = stored {
        secrets_of(s, &mut known);
    }
    let mut restored = false;
    restore(new, &known, &mut restored)?;
    Ok(restored)
}

fn restore(v: &mut Value, known: &[&str], restored: &mut bool) -> Result<(), String> {
    match v {
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                match child {
                    Value::String(s) if is_secret_key(k) && s.starts_with("****") => {
                        let mut matches: Vec<&str> = known.iter().copied().filter(|c| mask(c) == *s).collect();
                        matches.dedup();
                        match matches.as_slice() {
                            [one] => {
                                *s = one.to_string();
                                *restored = true;
                            }
                            [] => {
                                return Err(format!(
                                    "{k} is a masked value ({s}) that matches no stored secret: give the secret itself"
                                ));
                            }
                            _ => {
                                return Err(format!(
                                    "{k} is a masked value ({s}) that matches several stored secrets: give the secret itself"
                                ));
                            }
                        }
                    }
                    other => restore(other, known, restored)?,
                }
            }
        }
        Value::Array(a) => {
            for c in a {
                restore(c, known, restored)?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn masked_on_the_way_out_and_restored_on_the_way_back() {
        let stored = json!({"name": "s3", "settings": {"access_key": "AKIA", "secret_key": "wJalrXUtnFEMI/K7MDENG"},
                            "users": [{"credentials": [{"access_key": "a", "secret_key": "abcdefghijkl"}]}]});
        let mut shown = stored.clone();
        mask_json(&mut shown);
        assert_eq!(shown["settings"]["secret_key"], "****DENG");
        assert_eq!(shown["settings"]["access_key"], "AKIA");
        assert_eq!(shown["users"][0]["credentials"][0]["secret_key"], "****ijkl");
        assert!(!shown.to_string().contains("wJalr"));
        // Written back with one setting changed: the secrets come back.
        let mut back = shown.clone();
        back["settings"]["region"] = json!("eu-west-1");
        assert!(unmask_json(&mut back, Some(&stored)).unwrap());
        assert_eq!(back["settings"]["secret_key"], "wJalrXUtnFEMI/K7MDENG");
        assert_eq!(back["users"][0]["credentials"][0]["secret_key"], "abcdefghijkl");
        // A new secret is kept as given.
        let mut new = json!({"settings": {"secret_key": "brand-new-secret"}});
        assert!(!unmask_json(&mut new, Some(&stored)).unwrap());
        assert_eq!(new["settings"]["secret_key"], "brand-new-secret");
        // A mask of nothing stored, or of two different secrets: refused, never stored.
        let mut orphan = json!({"settings": {"secret_key": "****zzzz"}});
        assert!(unmask_json(&mut orphan, Some(&stored)).unwrap_err().contains("give the secret itself"));
        let two = json!({"a": {"secret_key": "short1"}, "b": {"secret_key": "short2"}});
        let mut ambiguous = json!({"a": {"secret_key": "****"}});
        assert!(unmask_json(&mut ambiguous, Some(&two)).unwrap_err().contains("several"));
        assert!(unmask_json(&mut json!({"secret_key": "****"}), None).is_err());
    }
}
