//! Splits a shell line into commands (separated by `;`) and each command into words, with
//! single quotes (literal), double quotes (backslash escapes `"` and `\`) and backslash escapes.

/// The commands of one line, each as its words. Empty commands (`;;`) are dropped.
pub fn split_line(line: &str) -> Result<Vec<Vec<String>>, String> {
    let mut commands = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ';' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                if !words.is_empty() {
                    commands.push(std::mem::take(&mut words));
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("unterminated single quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("unterminated double quote".into()),
                        },
                        Some(c) => word.push(c),
                        None => return Err("unterminated double quote".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => word.push(c),
                    None => return Err("a trailing backslash escapes nothing".into()),
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    if !words.is_empty() {
        commands.push(words);
    }
    Ok(commands)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&[&str]]) -> Vec<Vec<String>> {
        v.iter().map(|c| c.iter().map(|w| w.to_string()).collect()).collect()
    }

    #[test]
    fn splits_commands_and_words() {
        assert_eq!(
            split_line("fs.ls -l /docs; fs.cat /a").unwrap(),
            s(&[&["fs.ls", "-l", "/docs"], &["fs.cat", "/a"]])
        );
        assert_eq!(split_line("  ;; fs.ls ;").unwrap(), s(&[&["fs.ls"]]));
        assert_eq!(split_line("").unwrap(), Vec::<Vec<String>>::new());
    }

    #[test]
    fn quotes_and_escapes() {
        assert_eq!(split_line(r#"fs.put "my file.txt" '/a b;c'"#).unwrap(), s(&[&["fs.put", "my file.txt", "/a b;c"]]));
        assert_eq!(
            split_line(r#"x "a\"b\\c\d" a\ b -dir="/x y""#).unwrap(),
            s(&[&["x", r#"a"b\c\d"#, "a b", "-dir=/x y"]])
        );
        assert_eq!(split_line("x ''").unwrap(), s(&[&["x", ""]]));
        assert!(split_line("x 'open").is_err());
        assert!(split_line("x \"open").is_err());
        assert!(split_line("x \\").is_err());
    }
}
