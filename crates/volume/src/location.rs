//! Where a volume's blocks live: a local directory or an S3 bucket prefix, as the volume's
//! `data` setting names it (a path, or `s3://BUCKET/PREFIX?endpoint=URL&region=R`: no
//! secret is ever part of it), and the S3 credentials, which come from the environment or
//! the shared credentials file at every open and are never stored.

use std::fmt;
use std::path::{Path, PathBuf};

/// The region a bucket is addressed in when the user names none (S3's own default).
pub const S3_DEFAULT_REGION: &str = "us-east-1";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataLocation {
    Dir(PathBuf),
    S3(S3Location),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    /// The key prefix the volume's objects live under, without leading or trailing '/'
    /// (empty: the whole bucket).
    pub prefix: String,
    /// The server's URL (MinIO and other S3-compatible stores); None: AWS itself.
    pub endpoint: Option<String>,
    pub region: String,
}

impl DataLocation {
    /// A `--data` argument: `s3://BUCKET[/PREFIX]` with the endpoint and region given
    /// beside it, or a directory's path.
    pub fn from_arg(
        data: &str,
        endpoint: Option<&str>,
        region: Option<&str>,
    ) -> Result<DataLocation, String> {
        let Some(rest) = data.strip_prefix("s3://") else {
            if endpoint.is_some() || region.is_some() {
                return Err(format!(
                    "--s3-endpoint and --s3-region go with an s3:// data location, not the directory {data}"
                ));
            }
            return Ok(DataLocation::Dir(PathBuf::from(data)));
        };
        if rest.contains('?') {
            return Err(format!(
                "{data}: give the endpoint and region with --s3-endpoint and --s3-region, not in the URL"
            ));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if let Some(e) = endpoint
            && !(e.starts_with("http://") || e.starts_with("https://"))
        {
            return Err(format!(
                "--s3-endpoint {e}: give a URL starting with http:// or https://"
            ));
        }
        // Credentials in the endpoint (http://KEY:SECRET@host) would be stored in the
        // volume's settings and shown by `status`; not echoed here either.
        if let Some(e) = endpoint
            && e.split_once("://")
                .is_some_and(|(_, rest)| rest.split('/').next().is_some_and(|a| a.contains('@')))
        {
            return Err(
                "--s3-endpoint must not carry credentials (KEY:SECRET@ in the URL); give them in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or the credentials file"
                    .to_string(),
            );
        }
        let location = S3Location {
            bucket: bucket.to_owned(),
            prefix: prefix.trim_matches('/').to_owned(),
            endpoint: endpoint.map(|e| e.trim_end_matches('/').to_owned()),
            region: region.unwrap_or(S3_DEFAULT_REGION).to_owned(),
        };
        location.validate(data)?;
        Ok(DataLocation::S3(location))
    }

    /// The `data` setting of a volume, as `to_setting` wrote it.
    pub fn from_setting(setting: &str) -> Result<DataLocation, String> {
        let Some(rest) = setting.strip_prefix("s3://") else {
            return Ok(DataLocation::Dir(PathBuf::from(setting)));
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        let mut location = S3Location {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            endpoint: None,
            region: S3_DEFAULT_REGION.to_owned(),
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("endpoint", v)) => location.endpoint = Some(v.to_owned()),
                Some(("region", v)) => location.region = v.to_owned(),
                _ => {
                    return Err(format!(
                        "its data setting {setting} has an unknown part {pair}"
                    ));
                }
            }
        }
        location.validate(setting)?;
        Ok(DataLocation::S3(location))
    }

    /// The `data` setting: the directory's path, or the S3 URL with its endpoint and region
    /// (no credentials).
    pub fn to_setting(&self) -> String {
        match self {
            DataLocation::Dir(p) => p.to_string_lossy().into_owned(),
            DataLocation::S3(s) => {
                let mut url = format!("s3://{}", s.bucket);
                if !s.prefix.is_empty() {
                    url += "/";
                    url += &s.prefix;
                }
                url += &format!("?region={}", s.region);
                if let Some(e) = &s.endpoint {
                    url += &format!("&endpoint={e}");
                }
                url
            }
        }
    }

    /// The local directory, if the blocks live in one.
    pub fn local_dir(&self) -> Option<&Path> {
        match self {
            DataLocation::Dir(p) => Some(p),
            DataLocation::S3(_) => None,
        }
    }
}

impl S3Location {
    fn validate(&self, shown: &str) -> Result<(), String> {
        let bad = |c: char| c.is_whitespace() || c == '&' || c == '?' || c == '=';
        if self.bucket.is_empty() || self.bucket.contains(bad) {
            return Err(format!("{shown}: name a bucket, as in s3://BUCKET/PREFIX"));
        }
        if self.prefix.contains(bad) || self.region.is_empty() || self.region.contains(bad) {
            return Err(format!(
                "{shown}: the prefix and region may not hold spaces, '&', '?' or '='"
            ));
        }
        if let Some(e) = &self.endpoint
            && e.contains(bad)
        {
            return Err(format!(
                "the endpoint {e} may not hold spaces, '&', '?' or '='"
            ));
        }
        Ok(())
    }
}

impl fmt::Display for DataLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataLocation::Dir(p) => write!(f, "{}", p.display()),
            DataLocation::S3(s) => {
                write!(f, "s3://{}/{}", s.bucket, s.prefix)?;
                if let Some(e) = &s.endpoint {
                    write!(f, " at {e}")?;
                }
                Ok(())
            }
        }
    }
}

/// S3 credentials, read at each open; never stored, logged or shown.
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "S3Credentials {{ access_key_id: {}, .. }}",
            self.access_key_id
        )
    }
}

/// The credentials of the environment: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with
/// AWS_SESSION_TOKEN if set), else the profile AWS_PROFILE (or `default`) of the shared
/// credentials file (AWS_SHARED_CREDENTIALS_FILE, or ~/.aws/credentials).
pub fn s3_credentials() -> Result<S3Credentials, String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let (Some(id), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        return Ok(S3Credentials {
            access_key_id: id,
            secret_access_key: secret,
            session_token: var("AWS_SESSION_TOKEN"),
        });
    }
    let named = var("AWS_PROFILE");
    let profile = named.clone().unwrap_or_else(|| "default".to_owned());
    let file = var("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| Path::new(&h).join(".aws/credentials")));
    let text = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok());
    let none = || {
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with a profile in ~/.aws/credentials".to_owned()
    };
    let Some(text) = text else {
        return Err(none());
    };
    match profile_credentials(&text, &profile) {
        Some(c) => Ok(c),
        None if named.is_some() => Err(format!(
            "the AWS profile {profile} has no aws_access_key_id and aws_secret_access_key in {}",
            file.as_deref().unwrap_or(Path::new("")).display()
        )),
        None => Err(none()),
    }
}

/// A profile's keys in the INI text of a shared credentials file.
fn profile_credentials(text: &str, profile: &str) -> Option<S3Credentials> {
    let mut in_profile = false;
    let (mut id, mut secret, mut token) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_profile = section.trim() == profile;
            continue;
        }
        if !in_profile {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            let value = Some(value.trim().to_owned());
            match key.trim() {
                "aws_access_key_id" => id = value,
                "aws_secret_access_key" => secret = value,
                "aws_session_token" => token = value,
                _ => {}
            }
        }
    }
    Some(S3Credentials {
        access_key_id: id?,
        secret_access_key: secret?,
        session_token: token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_s3_location_round_trips_through_its_setting_without_secrets() {
        let l = DataLocation::from_arg(
            "s3://bucket/some/prefix/",
            Some("http://127.0.0.1:9000/"),
            Some("eu-west-1"),
        )
        .unwrap();
        let s = l.to_setting();
        assert_eq!(
            s,
            "s3://bucket/some/prefix?region=eu-west-1&endpoint=http://127.0.0.1:9000"
        );
        assert_eq!(DataLocation::from_setting(&s).unwrap(), l);
        let dir = DataLocation::from_arg("/srv/data", None, None).unwrap();
        assert_eq!(DataLocation::from_setting(&dir.to_setting()).unwrap(), dir);
        assert!(DataLocation::from_arg("/srv/data", Some("http://x"), None).is_err());
        assert!(DataLocation::from_arg("s3:///prefix", None, None).is_err());
        assert!(DataLocation::from_arg("s3://b/p", Some("ftp://x"), None).is_err());
    }

    #[test]
    fn an_endpoint_with_credentials_is_refused_without_echoing_them() {
        let e = DataLocation::from_arg("s3://b/p", Some("http://key:secret@127.0.0.1:9000"), None)
            .unwrap_err();
        assert!(
            e.contains("AWS_ACCESS_KEY_ID") && !e.contains("key:secret"),
            "{e}"
        );
        assert!(
            DataLocation::from_arg("s3://b/p", Some("http://127.0.0.1:9000/x@y"), None).is_ok()
        );
    }

    #[test]
    fn a_profile_is_read_from_its_section_only() {
        let text = "[default]\naws_access_key_id = A\naws_secret_access_key = B\n\n\
                    # comment\n[other]\naws_access_key_id=C\naws_secret_access_key=D\naws_session_token=E\n";
        let d = profile_credentials(text, "default").unwrap();
        assert_eq!(
            (d.access_key_id.as_str(), d.secret_access_key.as_str()),
            ("A", "B")
        );
        assert!(d.session_token.is_none());
        let o = profile_credentials(text, "other").unwrap();
        assert_eq!(o.session_token.as_deref(), Some("E"));
        assert!(profile_credentials(text, "missing").is_none());
    }
}
