//! S3 without long-lived keys, as a user runs it: no `-s3.access_key`, so the AWS SDK's default
//! credential chain finds them — a web identity (EKS's IRSA: `AWS_ROLE_ARN` and
//! `AWS_WEB_IDENTITY_TOKEN_FILE`, exchanged by `AssumeRoleWithWebIdentity`), or a profile whose
//! role is assumed (`AssumeRole`). moto serves STS (`AWS_ENDPOINT_URL_STS`) and records the
//! exchange; with no source of credentials at all the SDK would send nothing, so a mount that
//! reads is one the exchanged credentials signed.

use std::path::Path;

use bytes::Bytes;
use tidemark_cloud::aws::s3::S3Storage;
use tidemark_core::RemoteStorage;
use tidemark_testkit::{Moto, TidemarkProcess, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_identity_and_an_assumed_role_sign_in_through_sts() {
    let tmp = tempfile::tempdir().unwrap();
    let recording = tmp.path().join("moto-requests.jsonl");
    let moto = Moto::recording(&recording);
    let bucket = unique_name("awsid");
    let s3 = S3Storage::connect(&moto.conf("direct"), &bucket).await.unwrap();
    s3.client().create_bucket().bucket(&bucket).send().await.unwrap();
    s3.put("docs/hello.txt", Bytes::from_static(b"hello"), Default::default()).await.unwrap();

    let token = tmp.path().join("web-identity-token");
    std::fs::write(&token, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6dGlkZW1hcmsifQ.c2ln").unwrap();
    let web_identity = [
        ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/tidemark"),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token.to_str().unwrap()),
        ("AWS_ROLE_SESSION_NAME", "tidemark"),
        ("AWS_ENDPOINT_URL_STS", moto.endpoint.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let server = TidemarkProcess::server_with_env(bin(), &tmp.path().join("data"), &[], &web_identity);
    let sh = |cmd: &str, env: &[(&str, &str)]| run_shell(bin(), &server.addr, cmd, env);
    ok(sh(&format!("remote.configure -name=s3 -type=s3 -s3.endpoint={}", moto.endpoint), &[]));
    std::fs::write(&recording, b"").unwrap();
    ok(sh(&format!("remote.mount -dir=/mnt/s3 -remote=s3/{bucket}"), &web_identity));
    assert_eq!(ok(sh("fs.cat /mnt/s3/docs/hello.txt", &[])), "hello", "read by the server, with its web identity");
    let actions = Moto::recorded_actions(&recording);
    let exchanges = actions.iter().filter(|a| *a == "AssumeRoleWithWebIdentity").count();
    assert!(exchanges >= 2, "the shell and the server each exchanged the token: {actions:?}");

    // A profile that assumes a role from another profile's keys (a CI runner's, say).
    let config = tmp.path().join("aws-config");
    std::fs::write(
        &config,
        "[profile tidemark]\nrole_arn = arn:aws:iam::123456789012:role/tidemark-reader\nsource_profile = base\n\
         region = us-east-1\n\n[profile base]\naws_access_key_id = AKIAEXAMPLEBASE0001\n\
         aws_secret_access_key = base-secret-not-a-secret\n",
    )
    .unwrap();
    std::fs::write(&recording, b"").unwrap();
    let profile = [
        ("AWS_CONFIG_FILE", config.to_str().unwrap()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
        ("AWS_PROFILE", "tidemark"),
        ("AWS_ENDPOINT_URL_STS", moto.endpoint.as_str()),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    ok(sh(&format!("remote.mount -dir=/mnt/s3b -remote=s3/{bucket}/docs"), &profile));
    let actions = Moto::recorded_actions(&recording);
    assert!(actions.iter().any(|a| a == "AssumeRole"), "the role was assumed: {actions:?}");
    assert_eq!(ok(sh("fs.ls /mnt/s3b", &[])).trim(), "hello.txt");
}
