//! Deserializers of the value forms GitLab Runner writes: Go durations and TOML datetimes.

/// Go-style duration strings (`1m`, `20m0s`, `1h30m`) or plain seconds.
pub(crate) mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    /// A [`Duration`] from `"30s"`, `"1h30m"` or a number of seconds.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        let d = match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a duration such as \"30s\", \"5m\" or \"1h30m\"")
        })? {
            Raw::Secs(s) => Duration::from_secs(s),
            Raw::Text(t) => humantime::parse_duration(t.trim()).map_err(|e| {
                serde::de::Error::custom(format!(
                    "invalid duration {t:?} ({e}); expected e.g. \"30s\", \"5m\" or \"1h30m\""
                ))
            })?,
        };
        // Past Go's longest duration GitLab Runner cannot read it, and a deadline that far
        // away would overflow a clock.
        if d > crate::problem::GO_LONGEST {
            return Err(serde::de::Error::custom(
                "expected at most \"2562047h\" (Go's longest duration)",
            ));
        }
        Ok(d)
    }
}

/// GitLab Runner writes token dates as TOML datetimes (`0001-01-01T00:00:00Z`); strings in
/// RFC 3339 are taken too. Either is kept as its RFC 3339 text.
pub(crate) mod datetime_text {
    use std::fmt;

    use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};

    /// The datetime's RFC 3339 text.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = String;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a date-time such as 2024-01-01T00:00:00Z")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<String, E> {
                s.trim()
                    .parse::<toml::value::Datetime>()
                    .map(|d| d.to_string())
                    .map_err(|_| {
                        E::custom(format!(
                            "invalid date-time {s:?}; expected e.g. 2024-01-01T00:00:00Z"
                        ))
                    })
            }
            // The TOML text deserializer hands a datetime over as a one-key map.
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<String, A::Error> {
                toml::value::Datetime::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|d| d.to_string())
            }
        }
        d.deserialize_any(V).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{GOOD, errors};

    #[test]
    fn bad_duration_is_an_error_with_line() {
        let text = GOOD.replace("idle_time = \"20m0s\"", "idle_time = \"soon\"");
        let e = errors(&text);
        assert!(
            e[0].starts_with("config.toml:18: runners[0].autoscaler.policy[0].idle_time:"),
            "{e:?}"
        );
        assert!(e[0].contains("expected e.g."), "{e:?}");
    }
}
