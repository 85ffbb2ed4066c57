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

/// Where a value sits in a document: the keys down to it, with an array's elements named by
/// what identifies them (`name`, else `access_key`, else their index), so that adding, removing
/// or reordering elements leaves every other secret's place as it was.
fn child_place(place: &str, key: &str) -> String {
    format!("{place}/{key}")
}

fn element_place(place: &str, i: usize, element: &Value) -> String {
    let id = ["name", "access_key"]
        .iter()
        .find_map(|k| element.get(*k).and_then(Value::as_str).map(|v| format!("{k}={v}")))
        .unwrap_or_else(|| i.to_string());
    format!("{place}[{id}]")
}

fn secrets_of(v: &Value, place: String, out: &mut std::collections::HashMap<String, String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                match child {
                    Value::String(s) if is_secret_key(k) => {
                        out.insert(child_place(&place, k), s.clone());
                    }
                    other => secrets_of(other, child_place(&place, k), out),
                }
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                secrets_of(c, element_place(&place, i, c), out);
            }
        }
        _ => {}
    }
}

/// Puts the stored secrets back where `new` carries their masks, each from the same place in the
/// stored document (never from another identity's, whatever their last characters). A mask with
/// no stored secret at its place, or not that secret's mask, is refused: the writer must give the
/// secret itself. Returns whether anything was restored.
pub fn unmask_json(new: &mut Value, stored: Option<&Value>) -> Result<bool, String> {
    let mut known = std::collections::HashMap::new();
    if let Some(s) = stored {
        secrets_of(s, String::new(), &mut known);
    }
    let mut restored = false;
    restore(new, String::new(), &known, &mut restored)?;
    Ok(restored)
}

fn restore(
    v: &mut Value,
    place: String,
    known: &std::collections::HashMap<String, String>,
    restored: &mut bool,
) -> Result<(), String> {
    match v {
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                let here = child_place(&place, k);
                match child {
                    Value::String(s) if is_secret_key(k) && s.starts_with("****") => {
                        match known.get(&here).filter(|stored| mask(stored) == *s) {
                            Some(stored) => {
                                *s = stored.clone();
                                *restored = true;
                            }
                            None => {
                                return Err(format!(
                                    "{k} at {here} is a masked value ({s}) but no such secret is stored there: give the secret itself"
                                ));
                            }
                        }
                    }
                    other => restore(other, here, known, restored)?,
                }
            }
        }
        Value::Array(a) => {
            // Places are computed before any element changes (a restored secret is not an id).
            let places: Vec<String> = a.iter().enumerate().map(|(i, c)| element_place(&place, i, c)).collect();
            for (c, p) in a.iter_mut().zip(places) {
                restore(c, p, known, restored)?;
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
        let mut by_place = json!({"a": {"secret_key": "****"}, "b": {"secret_key": "****"}});
        assert!(unmask_json(&mut by_place, Some(&two)).unwrap());
        assert_eq!(by_place, two, "each short secret from its own place");
        assert!(unmask_json(&mut json!({"c": {"secret_key": "****"}}), Some(&two)).is_err(), "no secret there");
        assert!(unmask_json(&mut json!({"secret_key": "****"}), None).is_err());
    }

    /// Two identities whose secrets end alike: adding a third, or reordering them, keeps each
    /// one's own secret (matched by place: identity and access key), and a mask never carries a
    /// secret from one identity to another.
    #[test]
    fn masks_are_matched_by_their_place_not_their_last_characters() {
        let stored = json!({"identities": [
            {"name": "alice", "credentials": [{"access_key": "AK1", "secret_key": "alice-secret-WXYZ"}]},
            {"name": "bob", "credentials": [{"access_key": "AK2", "secret_key": "bobs-secret-WXYZ"}]}
        ]});
        let mut shown = stored.clone();
        mask_json(&mut shown);
        assert_eq!(shown["identities"][0]["credentials"][0]["secret_key"], "****WXYZ");
        assert_eq!(shown["identities"][1]["credentials"][0]["secret_key"], "****WXYZ");
        let mut added = shown.clone();
        let ids = added["identities"].as_array_mut().unwrap();
        ids.reverse();
        ids.insert(
            0,
            json!({"name": "carol", "credentials": [{"access_key": "AK3", "secret_key": "carol-new-secret"}]}),
        );
        assert!(unmask_json(&mut added, Some(&stored)).unwrap());
        let secret_of = |doc: &Value, name: &str| {
            doc["identities"].as_array().unwrap().iter().find(|i| i["name"] == name).unwrap()["credentials"][0]
                ["secret_key"]
                .clone()
        };
        assert_eq!(secret_of(&added, "alice"), "alice-secret-WXYZ");
        assert_eq!(secret_of(&added, "bob"), "bobs-secret-WXYZ");
        assert_eq!(secret_of(&added, "carol"), "carol-new-secret");
        // A mask put under another access key is not that key's secret: refused.
        let mut moved = shown.clone();
        moved["identities"][1]["credentials"][0]["access_key"] = json!("AK9");
        assert!(unmask_json(&mut moved, Some(&stored)).is_err());
    }
}
