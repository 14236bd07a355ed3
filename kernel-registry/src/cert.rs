//! Verification certificates: a worker's ed25519 signature over claims that bind one report.
//!
//! Two formats. [`FORMAT_JOB`] (`kernelize-certificate/2`), what a worker signs for a hub's
//! job: the claims also name the job's id and the nonce the hub handed out with the claim, so
//! that a certificate is valid for that one claim of that one job on that one hub, and a valid
//! certificate posted again for another job (a replay) is refused. [`FORMAT_UNBOUND`]
//! (`kernelize-certificate/1`): no job, what `kernelize cert sign` writes without `--job` for
//! verifications a hub imports (the bundled GPU runs' certificates); still read everywhere,
//! refused by a hub's job-report endpoint.
//!
//! The claims name the kernel (digest, name and version), the verdict (exactness class), where
//! it was measured (architecture, device, driver, CUDA and NVRTC versions), with what (verifier
//! and suite versions), the hash of the code each dtype ran, and the report itself: the SHA-256
//! of its RFC 8785 (JCS) canonical JSON, so that any change to any figure of the report breaks
//! the certificate. The signed bytes are the claims' JSON text exactly as carried in the
//! certificate (`claims`), so no verifier has to re-serialise anything to check a signature.
//!
//! Anyone holding the report, the kernel's source and the signer's public key can check a
//! certificate offline: [`Certificate::verify`] (signature, trusted key), then
//! [`Claims::check_report`] (the report is the one signed and says what the claims say) and
//! [`Claims::check_kernel`] (the source is the one verified).

use crate::report::VerificationReport;
use crate::{Arch, Digest};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The format of certificates bound to no job: read everywhere, accepted by a hub only where
/// it imports verifications measured elsewhere (bundled certificates), never for a job's report.
pub const FORMAT_UNBOUND: &str = "kernelize-certificate/1";
/// The format a worker signs for a hub's job: the claims name the job id and the claim's nonce.
pub const FORMAT_JOB: &str = "kernelize-certificate/2";
/// Every format this module reads.
pub const FORMATS: [&str; 2] = [FORMAT_UNBOUND, FORMAT_JOB];

/// What a certificate asserts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// [`FORMAT_UNBOUND`] or [`FORMAT_JOB`].
    pub format: String,
    /// [`FORMAT_JOB`] only: the id of the hub's job this report answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<i64>,
    /// [`FORMAT_JOB`] only: the nonce the hub handed out with the claim of that job (fresh at
    /// every claim, so a certificate of an earlier claim of the same job does not carry over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// SHA-256 (hex) of the report's RFC 8785 canonical JSON.
    pub report_sha256: String,
    pub kernel_digest: Digest,
    /// `name@version`.
    pub kernel: String,
    /// The report's exactness class (its summary's, as the hub derives it from the cases).
    pub class: String,
    pub arch: Arch,
    pub device: String,
    pub driver_version: String,
    pub cuda_version: String,
    /// The NVRTC versions that compiled the kernel (one per distinct version, sorted).
    pub nvrtc_versions: Vec<String>,
    pub verifier_version: String,
    pub suite_version: String,
    /// Per dtype, the SHA-256 of the code the GPU ran.
    pub compiled: Vec<CompiledHash>,
    /// When the worker signed (RFC 3339).
    pub signed_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompiledHash {
    pub dtype: String,
    pub code_sha256: String,
}

/// A signed statement about one verification report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    /// The claims' JSON text: the exact bytes signed.
    pub claims: String,
    /// The signer's ed25519 public key (32 bytes, standard base64).
    pub key: String,
    /// The signature over `claims` (64 bytes, standard base64).
    pub signature: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("the certificate's {what} is not valid base64 of {len} bytes")]
    Encoding { what: &'static str, len: usize },
    #[error("the certificate's key {0} is not a valid ed25519 public key")]
    BadKey(String),
    #[error("the signature does not verify: the claims, the signature or the key were changed")]
    BadSignature,
    #[error("the certificate is signed by key {0}, which is not among the trusted keys")]
    Untrusted(String),
    #[error("the certificate's claims are not valid certificate claims: {0}")]
    BadClaims(String),
    /// A valid certificate presented for another job or claim than the one it names.
    #[error("{0}")]
    NotForThisJob(String),
    #[error("the report is not the one certified: {0}")]
    ReportMismatch(String),
    #[error("the kernel is not the one certified: {0}")]
    KernelMismatch(String),
}

/// The largest integer a JSON number (an IEEE double) holds exactly: 2^53 - 1.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The SHA-256 (hex) of a JSON value's RFC 8785 canonical form, after writing every integer
/// outside +-(2^53 - 1) as its decimal string. RFC 8785 formats numbers as IEEE doubles, which
/// would round such integers (a report's seed is any u64): a seed changed by one would keep
/// the digest. The Python client (`kernelize.certs`) computes the same digest.
pub fn canonical_sha256(value: &serde_json::Value) -> String {
    let bytes = serde_json_canonicalizer::to_vec(&exact_integers(value))
        .expect("a JSON value canonicalises");
    hex::encode(Sha256::digest(bytes))
}

fn exact_integers(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_u64() || n.is_i64() => {
            let safe = n
                .as_u64()
                .map(|u| u <= MAX_SAFE_INTEGER)
                .unwrap_or_else(|| {
                    n.as_i64()
                        .is_some_and(|i| i.unsigned_abs() <= MAX_SAFE_INTEGER)
                });
            if safe {
                v.clone()
            } else {
                Value::String(n.to_string())
            }
        }
        Value::Array(items) => Value::Array(items.iter().map(exact_integers).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, x)| (k.clone(), exact_integers(x)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The canonical digest of a report: what a certificate's `report_sha256` holds.
pub fn report_sha256(report: &VerificationReport) -> String {
    canonical_sha256(&serde_json::to_value(report).expect("a report serialises"))
}

/// A short, stable name for a public key (the first 16 hex digits of its SHA-256), for logs
/// and messages.
pub fn key_id(key_b64: &str) -> String {
    hex::encode(&Sha256::digest(key_b64.as_bytes())[..8])
}

/// The public keys of a trusted-keys file: one per line, `#` starts a comment.
pub fn parse_key_list(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// A public key as carried in certificates and registries.
pub fn encode_key(key: &VerifyingKey) -> String {
    B64.encode(key.as_bytes())
}

/// Parse a public key as carried in certificates and registries.
pub fn decode_key(key_b64: &str) -> Result<VerifyingKey, CertError> {
    let bytes: [u8; 32] = decode_exact(key_b64.trim(), "key")?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| CertError::BadKey(key_id(key_b64)))
}

/// A signing key from its 32 secret bytes, standard base64 (what `kernelize worker init`
/// writes).
pub fn decode_signing_key(secret_b64: &str) -> Result<SigningKey, CertError> {
    let bytes: [u8; 32] = decode_exact(secret_b64.trim(), "secret key")?;
    Ok(SigningKey::from_bytes(&bytes))
}

pub fn encode_signing_key(key: &SigningKey) -> String {
    B64.encode(key.to_bytes())
}

fn decode_exact<const N: usize>(s: &str, what: &'static str) -> Result<[u8; N], CertError> {
    B64.decode(s)
        .ok()
        .and_then(|v| <[u8; N]>::try_from(v).ok())
        .ok_or(CertError::Encoding { what, len: N })
}

impl Claims {
    /// The claims a worker makes about `report` for the hub's job `job_id`, claimed with
    /// `nonce`, signed at `signed_at` ([`FORMAT_JOB`]).
    pub fn for_job(
        report: &VerificationReport,
        signed_at: &str,
        job_id: i64,
        nonce: &str,
    ) -> Claims {
        Claims {
            format: FORMAT_JOB.to_string(),
            job_id: Some(job_id),
            nonce: Some(nonce.to_string()),
            ..Claims::of(report, signed_at)
        }
    }

    /// The claims about `report` bound to no job ([`FORMAT_UNBOUND`]), signed at `signed_at`:
    /// for verifications a hub imports (`kernelize cert sign` without `--job`), never for a
    /// job's report.
    pub fn of(report: &VerificationReport, signed_at: &str) -> Claims {
        let mut nvrtc: Vec<String> = report
            .compiled
            .iter()
            .map(|c| c.nvrtc_version.clone())
            .collect();
        nvrtc.sort();
        nvrtc.dedup();
        Claims {
            format: FORMAT_UNBOUND.to_string(),
            job_id: None,
            nonce: None,
            report_sha256: report_sha256(report),
            kernel_digest: report.kernel.digest.clone(),
            kernel: format!("{}@{}", report.kernel.name, report.kernel.version),
            class: report.summary.overall.class.to_string(),
            arch: report.device.arch,
            device: report.device.name.clone(),
            driver_version: report.device.driver_version.clone(),
            cuda_version: report.device.cuda_version.clone(),
            nvrtc_versions: nvrtc,
            verifier_version: report.verifier_version.clone(),
            suite_version: report.suite_version.clone(),
            compiled: report
                .compiled
                .iter()
                .map(|c| CompiledHash {
                    dtype: c.dtype.to_string(),
                    code_sha256: c.code_sha256.clone(),
                })
                .collect(),
            signed_at: signed_at.to_string(),
        }
    }

    /// `report` is the report these claims were made of: its canonical digest is the one
    /// signed, and every field the claims name says the same in the report.
    pub fn check_report(&self, report: &VerificationReport) -> Result<(), CertError> {
        let digest = report_sha256(report);
        if digest != self.report_sha256 {
            return Err(CertError::ReportMismatch(format!(
                "its canonical SHA-256 is {digest}, the certificate's {}",
                self.report_sha256
            )));
        }
        let mine = Claims::of(report, &self.signed_at);
        let fields: [(&str, String, String); 11] = [
            (
                "kernel_digest",
                self.kernel_digest.to_string(),
                mine.kernel_digest.to_string(),
            ),
            ("kernel", self.kernel.clone(), mine.kernel),
            ("class", self.class.clone(), mine.class),
            ("arch", self.arch.to_string(), mine.arch.to_string()),
            ("device", self.device.clone(), mine.device),
            (
                "driver_version",
                self.driver_version.clone(),
                mine.driver_version,
            ),
            ("cuda_version", self.cuda_version.clone(), mine.cuda_version),
            (
                "nvrtc_versions",
                self.nvrtc_versions.join(","),
                mine.nvrtc_versions.join(","),
            ),
            (
                "verifier_version",
                self.verifier_version.clone(),
                mine.verifier_version,
            ),
            (
                "suite_version",
                self.suite_version.clone(),
                mine.suite_version,
            ),
            (
                "compiled",
                format!("{:?}", self.compiled),
                format!("{:?}", mine.compiled),
            ),
        ];
        for (field, claimed, actual) in fields {
            if claimed != actual {
                return Err(CertError::ReportMismatch(format!(
                    "the certificate says {field} `{claimed}`, the report `{actual}`"
                )));
            }
        }
        Ok(())
    }

    /// Claims from their JSON text: a known format, and the job binding exactly when the format
    /// has one (a /1 certificate naming a job, or a /2 one naming none, is malformed).
    pub fn parse(text: &str) -> Result<Claims, CertError> {
        let claims: Claims =
            serde_json::from_str(text).map_err(|e| CertError::BadClaims(e.to_string()))?;
        match (
            claims.format.as_str(),
            claims.job_id,
            claims.nonce.as_deref(),
        ) {
            (FORMAT_UNBOUND, None, None) => Ok(claims),
            (FORMAT_UNBOUND, ..) => Err(CertError::BadClaims(format!(
                "format `{FORMAT_UNBOUND}` names no job, but these claims carry `job_id` or `nonce`"
            ))),
            (FORMAT_JOB, Some(id), Some(nonce)) if id > 0 && !nonce.is_empty() => Ok(claims),
            (FORMAT_JOB, ..) => Err(CertError::BadClaims(format!(
                "format `{FORMAT_JOB}` needs a positive `job_id` and a non-empty `nonce`"
            ))),
            (other, ..) => Err(CertError::BadClaims(format!(
                "format `{other}`, expected one of {}",
                FORMATS.join(", ")
            ))),
        }
    }

    /// These claims were made for the hub's job `job_id` as claimed with `nonce` (the job's
    /// current claim). Refused: claims bound to no job ([`FORMAT_UNBOUND`]), to another job,
    /// or to another claim of this job (an earlier attempt's nonce).
    pub fn check_job(&self, job_id: i64, nonce: &str) -> Result<(), CertError> {
        const FIX: &str = "a certificate is valid only for the job and claim it was issued for; claim the job, verify it and sign the report with the job id and the nonce of that claim";
        match (self.job_id, self.nonce.as_deref()) {
            (None, _) | (_, None) => Err(CertError::NotForThisJob(format!(
                "the certificate ({}) names no job: a job's report needs a `{FORMAT_JOB}` certificate naming job {job_id} and its claim's nonce (a worker of this release signs one; `{FORMAT_UNBOUND}` certificates are accepted only where a hub imports bundled verifications); {FIX}",
                self.format
            ))),
            (Some(named), _) if named != job_id => Err(CertError::NotForThisJob(format!(
                "the certificate names job {named}, this is job {job_id}: {FIX}"
            ))),
            (Some(_), Some(n)) if n != nonce => Err(CertError::NotForThisJob(format!(
                "the certificate names job {job_id} but another claim of it (nonce {n}, not the current claim's): {FIX}"
            ))),
            _ => Ok(()),
        }
    }

    /// The kernel whose digest is `digest` (computed from its manifest and source) is the one
    /// certified.
    pub fn check_kernel(&self, digest: &Digest) -> Result<(), CertError> {
        if *digest != self.kernel_digest {
            return Err(CertError::KernelMismatch(format!(
                "its digest is {digest}, the certificate's {}",
                self.kernel_digest
            )));
        }
        Ok(())
    }
}

impl Certificate {
    /// Sign `claims` with `key`.
    pub fn sign(key: &SigningKey, claims: &Claims) -> Certificate {
        let text = serde_json::to_string(claims).expect("claims serialise");
        let sig: Signature = key.sign(text.as_bytes());
        Certificate {
            claims: text,
            key: encode_key(&key.verifying_key()),
            signature: B64.encode(sig.to_bytes()),
        }
    }

    /// Check the signature and that the signer is trusted (`trusted`: public keys as carried,
    /// compared after decoding), and return the claims.
    pub fn verify(&self, trusted: &[String]) -> Result<Claims, CertError> {
        let key = decode_key(&self.key)?;
        let trusted_here = trusted
            .iter()
            .filter_map(|k| decode_key(k).ok())
            .any(|k| k == key);
        if !trusted_here {
            return Err(CertError::Untrusted(key_id(&self.key)));
        }
        self.verify_signature()
    }

    /// Check the signature alone (against the key the certificate names) and return the
    /// claims. Whether that key is trusted is the caller's question.
    pub fn verify_signature(&self) -> Result<Claims, CertError> {
        let key = decode_key(&self.key)?;
        let sig: [u8; 64] = decode_exact(&self.signature, "signature")?;
        key.verify_strict(self.claims.as_bytes(), &Signature::from_bytes(&sig))
            .map_err(|_| CertError::BadSignature)?;
        Claims::parse(&self.claims)
    }

    /// The signer's key id (see [`key_id`]).
    pub fn key_id(&self) -> String {
        key_id(&self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests_support::report_with;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn signed() -> (VerificationReport, Certificate, String) {
        let report = report_with(0, 0);
        let k = key(7);
        let cert = Certificate::sign(&k, &Claims::of(&report, "2026-11-23T08:00:00Z"));
        let trusted = encode_key(&k.verifying_key());
        (report, cert, trusted)
    }

    #[test]
    fn a_certificate_round_trips_and_binds_its_report_and_kernel() {
        let (report, cert, trusted) = signed();
        let claims = cert.verify(std::slice::from_ref(&trusted)).unwrap();
        assert_eq!(claims.kernel_digest, report.kernel.digest);
        assert_eq!(claims.class, report.summary.overall.class.to_string());
        claims.check_report(&report).unwrap();
        claims.check_kernel(&report.kernel.digest).unwrap();
        // Through JSON and back (as stored and served) it still verifies.
        let back: Certificate =
            serde_json::from_str(&serde_json::to_string(&cert).unwrap()).unwrap();
        back.verify(&[trusted])
            .unwrap()
            .check_report(&report)
            .unwrap();
    }

    #[test]
    fn every_claim_is_bound_by_the_signature() {
        let (report, unbound, trusted) = signed();
        let bound = Certificate::sign(
            &key(7),
            &Claims::for_job(&report, "2026-11-23T08:00:00Z", 12, "00ff"),
        );
        for (cert, n) in [(unbound, 14), (bound, 16)] {
            let claims: serde_json::Value = serde_json::from_str(&cert.claims).unwrap();
            let fields: Vec<String> = claims.as_object().unwrap().keys().cloned().collect();
            assert_eq!(fields.len(), n, "{fields:?}");
            for field in fields {
                let mut v = claims.clone();
                v[&field] = match &v[&field] {
                    serde_json::Value::String(s) => serde_json::json!(format!("{s}x")),
                    serde_json::Value::Array(_) => serde_json::json!([]),
                    serde_json::Value::Number(n) => serde_json::json!(n.as_i64().unwrap() + 1),
                    other => panic!("{field}: {other}"),
                };
                let forged = Certificate {
                    claims: serde_json::to_string(&v).unwrap(),
                    ..cert.clone()
                };
                assert_eq!(
                    forged.verify(std::slice::from_ref(&trusted)),
                    Err(CertError::BadSignature),
                    "changing {field} kept the signature valid"
                );
            }
        }
    }

    /// Format /1 claims name no job, /2 claims name a job and a nonce; both are read, each
    /// only in its own shape, and nothing else is.
    #[test]
    fn claims_formats_and_their_job_binding() {
        let report = report_with(0, 0);
        let k = key(7);
        let trusted = [encode_key(&k.verifying_key())];
        let sign_json = |v: serde_json::Value| {
            let text = serde_json::to_string(&v).unwrap();
            Certificate {
                signature: B64.encode(k.sign(text.as_bytes()).to_bytes()),
                claims: text,
                key: trusted[0].clone(),
            }
        };
        // /1: read, bound to no job, so refused for any job.
        let v1 = Certificate::sign(&k, &Claims::of(&report, "2026-11-23T08:00:00Z"));
        let c1 = v1.verify(&trusted).unwrap();
        assert_eq!(c1.format, FORMAT_UNBOUND);
        assert_eq!((c1.job_id, c1.nonce.as_deref()), (None, None));
        assert!(!v1.claims.contains("job_id") && !v1.claims.contains("nonce"));
        c1.check_report(&report).unwrap();
        let e = c1.check_job(12, "00ff").unwrap_err();
        assert!(
            matches!(e, CertError::NotForThisJob(ref m) if m.contains("names no job")),
            "{e}"
        );
        // /2: read, binds its job and nonce, and the report as /1 does.
        let v2 = Certificate::sign(
            &k,
            &Claims::for_job(&report, "2026-11-23T08:00:00Z", 12, "00ff"),
        );
        let c2 = v2.verify(&trusted).unwrap();
        assert_eq!(c2.format, FORMAT_JOB);
        assert_eq!((c2.job_id, c2.nonce.as_deref()), (Some(12), Some("00ff")));
        c2.check_report(&report).unwrap();
        c2.check_job(12, "00ff").unwrap();
        let e = c2.check_job(13, "00ff").unwrap_err().to_string();
        assert!(
            e.contains("names job 12, this is job 13") && e.contains("claim the job"),
            "{e}"
        );
        let e = c2.check_job(12, "abcd").unwrap_err().to_string();
        assert!(e.contains("another claim of it"), "{e}");
        // The binding must match the format: each shape below is signed, yet refused.
        let mut base: serde_json::Value = serde_json::from_str(&v2.claims).unwrap();
        let mut cases = Vec::new();
        let mut v = base.clone();
        v["format"] = serde_json::json!(FORMAT_UNBOUND);
        cases.push(("/1 naming a job", v));
        let mut v = base.clone();
        v.as_object_mut().unwrap().remove("nonce");
        cases.push(("/2 without a nonce", v));
        let mut v = base.clone();
        v.as_object_mut().unwrap().remove("job_id");
        cases.push(("/2 without a job", v));
        let mut v = base.clone();
        v["nonce"] = serde_json::json!("");
        cases.push(("/2 with an empty nonce", v));
        let mut v = base.clone();
        v["job_id"] = serde_json::json!(0);
        cases.push(("/2 with job 0", v));
        let mut v = base.clone();
        v["format"] = serde_json::json!("kernelize-certificate/3");
        cases.push(("an unknown format", v));
        base["extra"] = serde_json::json!("x");
        cases.push(("an unknown field", base));
        for (what, v) in cases {
            let e = sign_json(v).verify(&trusted).unwrap_err();
            assert!(matches!(e, CertError::BadClaims(_)), "{what}: {e:?}");
        }
    }

    #[test]
    fn a_changed_report_kernel_key_or_signature_is_refused() {
        let (report, cert, trusted) = signed();
        let claims = cert.verify(std::slice::from_ref(&trusted)).unwrap();
        // Any figure of the report.
        let mut r = report.clone();
        r.cases[0].exactness.as_mut().unwrap().mismatches += 1;
        assert!(matches!(
            claims.check_report(&r),
            Err(CertError::ReportMismatch(_))
        ));
        let mut r = report.clone();
        r.duration_s += 1.0;
        assert!(matches!(
            claims.check_report(&r),
            Err(CertError::ReportMismatch(_))
        ));
        // Another kernel.
        let other: Digest = format!("sha256:{}", "ab".repeat(32)).parse().unwrap();
        assert!(matches!(
            claims.check_kernel(&other),
            Err(CertError::KernelMismatch(_))
        ));
        // Another signer, untrusted; the same signer's key swapped for another trusted one.
        let mallory = Certificate::sign(&key(9), &claims);
        assert!(matches!(
            mallory.verify(std::slice::from_ref(&trusted)),
            Err(CertError::Untrusted(_))
        ));
        let swapped = Certificate {
            key: encode_key(&key(9).verifying_key()),
            ..cert.clone()
        };
        assert_eq!(
            swapped.verify(&[encode_key(&key(9).verifying_key())]),
            Err(CertError::BadSignature)
        );
        // A flipped signature byte; garbage encodings.
        let mut sig = B64.decode(&cert.signature).unwrap();
        sig[10] ^= 1;
        let flipped = Certificate {
            signature: B64.encode(sig),
            ..cert.clone()
        };
        assert_eq!(
            flipped.verify(std::slice::from_ref(&trusted)),
            Err(CertError::BadSignature)
        );
        let garbled = Certificate {
            signature: "not base64!".into(),
            ..cert.clone()
        };
        assert!(matches!(
            garbled.verify(std::slice::from_ref(&trusted)),
            Err(CertError::Encoding { .. })
        ));
    }

    #[test]
    fn claims_that_contradict_their_report_are_refused_even_when_signed() {
        let (report, _, _) = signed();
        let mut claims = Claims::of(&report, "2026-11-23T08:00:00Z");
        claims.class = "bit_exact_liar".into();
        let err = claims.check_report(&report).unwrap_err();
        assert!(err.to_string().contains("says class"), "{err}");
    }

    /// The capability audit is part of the certified report: it round-trips through JSON,
    /// any change to it breaks the certificate, and a report without one (made before the
    /// audit) keeps its canonical digest, so its certificate (/1 or /2) still verifies.
    #[test]
    fn the_capability_audit_is_certified_and_old_reports_keep_their_digest() {
        use crate::capability::{audit_ptx, Capability, CapabilityReport, DeclaredCapability};
        let mut old = report_with(0, 0);
        old.capabilities = None; // made before the audit
        let cert = Certificate::sign(&key(7), &Claims::of(&old, "2026-11-23T08:00:00Z"));
        let trusted = encode_key(&key(7).verifying_key());
        let json = serde_json::to_value(&old).unwrap();
        assert!(json.get("capabilities").is_none());
        let back: VerificationReport = serde_json::from_value(json).unwrap();
        cert.verify(std::slice::from_ref(&trusted))
            .unwrap()
            .check_report(&back)
            .unwrap();
        let mut r = report_with(0, 0);
        r.capabilities = Some(CapabilityReport::of_modules(
            &[(
                crate::DType::Bf16,
                Ok(audit_ptx(".visible .entry k()\n{\ntrap;\n}\n")),
            )],
            &[DeclaredCapability {
                name: Capability::Trap,
                reason: "bad launch shapes".into(),
            }],
        ));
        let cert = Certificate::sign(
            &key(7),
            &Claims::for_job(&r, "2026-11-27T05:00:00Z", 3, "ab"),
        );
        let text = serde_json::to_string(&r).unwrap();
        assert!(
            text.contains(r#""capabilities":{"audited":true,"found":[{"name":"trap""#),
            "{text}"
        );
        let back: VerificationReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        let claims = cert.verify(std::slice::from_ref(&trusted)).unwrap();
        claims.check_report(&back).unwrap();
        let mut forged = back.clone();
        forged.capabilities.as_mut().unwrap().found.clear();
        assert!(matches!(
            claims.check_report(&forged),
            Err(CertError::ReportMismatch(_))
        ));
        let mut stripped = back;
        stripped.capabilities = None;
        assert!(matches!(
            claims.check_report(&stripped),
            Err(CertError::ReportMismatch(_))
        ));
    }

    #[test]
    fn key_lists_skip_comments_and_blank_lines() {
        let keys = parse_key_list("# the project's run\nAAA= # gpu0\n\n  BBB=  \n#CCC=\n");
        assert_eq!(keys, vec!["AAA=".to_string(), "BBB=".to_string()]);
    }

    #[test]
    fn integers_beyond_doubles_are_bound_exactly() {
        let mut r = report_with(0, 0);
        r.seed = u64::MAX - 1;
        let a = report_sha256(&r);
        r.seed = u64::MAX;
        assert_ne!(
            a,
            report_sha256(&r),
            "a seed changed by one kept the digest"
        );
        let big = serde_json::json!({"n": 9007199254740993u64});
        let near = serde_json::json!({"n": 9007199254740992u64});
        assert_ne!(canonical_sha256(&big), canonical_sha256(&near));
    }

    /// The digest the Python client must reproduce (python/tests/test_certs.py holds the
    /// same value and input).
    #[test]
    fn the_canonical_digest_is_pinned() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"z": [1, 2.5, 1e21, 1.0, -0.0, "é\u0001"], "a": {"seed": 18446744073709551615, "f": 0.1}}"#,
        )
        .unwrap();
        assert_eq!(
            canonical_sha256(&v),
            "185591ca3e49ce3f6071872be7ad55eaae24ba06bdd9edd02439ae3c715963e2"
        );
    }

    #[test]
    fn canonical_digests_ignore_key_order_and_number_spelling() {
        let a: serde_json::Value = serde_json::from_str(r#"{"b": 1.0, "a": [1e2, "x"]}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"a": [100, "x"], "b": 1}"#).unwrap();
        assert_eq!(canonical_sha256(&a), canonical_sha256(&b));
        let c: serde_json::Value = serde_json::from_str(r#"{"a": [100, "x"], "b": 2}"#).unwrap();
        assert_ne!(canonical_sha256(&a), canonical_sha256(&c));
    }
}
