//! The one check every VM, image and snapshot name passes, on either side of the wire.

/// A name that is not `[A-Za-z0-9._-]{1,64}` (or starts with a `.`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {name:?}: expected 1 to 64 of A-Z a-z 0-9 . _ -")]
pub struct BadName {
    /// What was named.
    pub what: &'static str,
    /// The name.
    pub name: String,
}

/// Check a VM, image or snapshot name.
pub fn check_name(what: &'static str, name: &str) -> Result<(), BadName> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(BadName {
            what,
            name: name.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("image", "debian-12_x.1").is_ok());
        assert!(check_name("image", &"a".repeat(64)).is_ok());
        for bad in ["", ".hidden", "a/b", "a b", &"a".repeat(65)] {
            let e = check_name("image", bad).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("invalid image {bad:?}: expected 1 to 64 of A-Z a-z 0-9 . _ -")
            );
        }
    }
}
