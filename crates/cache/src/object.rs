//! Where a cache lives in the bucket: GitLab Runner's object names.

use crate::CacheError;

/// The object of cache `key` of project `project_id`: `<path>/runner/<short_token>/project/<id>/<key>`,
/// without the `runner/<short_token>` part when `shared`. A key that would climb out of the
/// project's part (`../`) is refused, as GitLab Runner refuses it.
pub fn object_name(
    path: &str,
    shared: bool,
    short_token: &str,
    project_id: u64,
    key: &str,
) -> Result<String, CacheError> {
    let mut base: Vec<&str> = Vec::new();
    push_clean(&mut base, path);
    if !shared {
        base.push("runner");
        push_clean(&mut base, short_token);
    }
    base.push("project");
    let project = project_id.to_string();
    base.push(&project);
    let depth = base.len();
    let mut full = base.clone();
    push_clean(&mut full, key);
    // `..` popped into the base, or nothing left of the key: outside the project's part.
    if full.len() <= depth || full[..depth] != base[..] {
        return Err(CacheError::KeyOutsideProject {
            key: key.to_string(),
        });
    }
    Ok(full.join("/"))
}

/// Append the segments of `p` to `out` as `path.Join` would: empty and `.` segments dropped,
/// `..` removing the last one.
fn push_clean<'a>(out: &mut Vec<&'a str>, p: &'a str) {
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_gitlab_runner() {
        assert_eq!(
            object_name("", false, "fAkErUnNe", 42, "default-protected").unwrap(),
            "runner/fAkErUnNe/project/42/default-protected"
        );
        assert_eq!(
            object_name("ci/cache/", true, "fAkErUnNe", 42, "deps").unwrap(),
            "ci/cache/project/42/deps"
        );
    }

    #[test]
    fn keys_cannot_leave_the_project() {
        for key in ["../other", "a/../../x", "..", ""] {
            assert!(
                object_name("p", false, "t", 1, key).is_err(),
                "{key:?} accepted"
            );
        }
        assert_eq!(
            object_name("p", false, "t", 1, "a/../b").unwrap(),
            "p/runner/t/project/1/b"
        );
    }
}
