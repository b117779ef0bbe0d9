//! How hard archives are compressed: GitLab's `ARTIFACT_COMPRESSION_LEVEL` and
//! `CACHE_COMPRESSION_LEVEL`.

/// A compression level by GitLab's name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Compression {
    /// `fastest`: stored, not compressed (incompressible data costs nothing).
    Fastest,
    /// `fast`: deflate level 1.
    Fast,
    /// `default`: deflate's default level.
    #[default]
    Default,
    /// `slow`: deflate level 7.
    Slow,
    /// `slowest`: deflate level 9.
    Slowest,
}

impl Compression {
    /// The level named `name` (`fastest`, `fast`, `default`, `slow`, `slowest`), any case.
    pub fn parse(name: &str) -> Option<Compression> {
        match name.trim().to_ascii_lowercase().as_str() {
            "fastest" => Some(Compression::Fastest),
            "fast" => Some(Compression::Fast),
            "" | "default" => Some(Compression::Default),
            "slow" => Some(Compression::Slow),
            "slowest" => Some(Compression::Slowest),
            _ => None,
        }
    }

    /// The level a job's `variable` (`ARTIFACT_COMPRESSION_LEVEL`, `CACHE_COMPRESSION_LEVEL`)
    /// names, and for a name that is none of GitLab's the warning for its trace (the default
    /// level is used, as GitLab Runner does).
    pub fn named(value: &str, variable: &str) -> (Compression, Option<String>) {
        match Compression::parse(value) {
            Some(c) => (c, None),
            None => (
                Compression::Default,
                Some(format!(
                    "WARNING: {variable} {:?} is not one of fastest, fast, default, slow, \
                     slowest; using default",
                    crate::format::shown(value)
                )),
            ),
        }
    }

    /// The deflate level; `None` for deflate's default, `Some(0)` for stored.
    pub(crate) fn level(self) -> Option<i64> {
        match self {
            Compression::Fastest => Some(0),
            Compression::Fast => Some(1),
            Compression::Default => None,
            Compression::Slow => Some(7),
            Compression::Slowest => Some(9),
        }
    }

    /// The Zstandard level for `tarzstd` caches: 1, 2, 3 (zstd's default), 7, 11 (the
    /// native levels closest to GitLab Runner's fastest … best encoder speeds).
    pub(crate) fn zstd_level(self) -> i32 {
        match self {
            Compression::Fastest => 1,
            Compression::Fast => 2,
            Compression::Default => 3,
            Compression::Slow => 7,
            Compression::Slowest => 11,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fastest_stores_and_default_deflates_and_both_read_back() {
        let data = vec![b'a'; 100_000];
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, "out/a.txt", &data[..]).unwrap();
        let tar = b.into_inner().unwrap();
        let zip = |c| {
            crate::archive_from_tar_with(&tar, crate::Format::Zip, &|_| true, c)
                .unwrap()
                .bytes
        };
        let (stored, deflated) = (zip(Compression::Fastest), zip(Compression::Default));
        assert!(stored.len() > data.len(), "{}", stored.len());
        assert!(deflated.len() < data.len() / 10, "{}", deflated.len());
        for z in [stored, deflated, zip(Compression::Slowest)] {
            let back = crate::zip_to_tar(&z).unwrap();
            assert!(back.windows(1000).any(|w| w == &data[..1000]));
        }
    }

    #[test]
    fn unknown_names_are_warnings_that_quote_at_most_64_characters() {
        assert_eq!(Compression::named("fast", "X"), (Compression::Fast, None));
        let (c, w) = Compression::named("quick", "ARTIFACT_COMPRESSION_LEVEL");
        assert_eq!(c, Compression::Default);
        assert_eq!(
            w.unwrap(),
            "WARNING: ARTIFACT_COMPRESSION_LEVEL \"quick\" is not one of fastest, fast, \
             default, slow, slowest; using default"
        );
        let long = "z".repeat(100_000);
        let (f, w) = crate::Format::cache_named(&long);
        assert_eq!(f, crate::Format::Zip);
        let w = w.unwrap();
        assert!(
            w.len() < 200 && w.contains(&format!("{}…", "z".repeat(64))),
            "{w}"
        );
        assert_eq!(
            crate::Format::cache_named("TarZstd"),
            (crate::Format::TarZstd, None)
        );
    }

    #[test]
    fn gitlab_names_parse() {
        assert_eq!(Compression::parse("FASTEST"), Some(Compression::Fastest));
        assert_eq!(Compression::parse(""), Some(Compression::Default));
        assert_eq!(Compression::parse("quick"), None);
    }
}
