//! Azure without long-lived secrets, as a user runs it: no account key, no SAS — the storage
//! account's data plane (Blob and Queue) and Resource Manager are signed in to with Microsoft
//! Entra ID tokens that `azure_identity` gets and refreshes. Azurite in its OAuth mode (over
//! HTTPS) checks each token's issuer, audience and times; `AzureArmDouble` plays Entra ID's token
//! endpoint (a service principal's secret, a workload identity's federated token), App Service's
//! managed identity endpoint, and Resource Manager.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidemark_cloud::azure::{AzureBlobStorage, AzureQueueSource};
use tidemark_core::RemoteStorage;
use tidemark_testkit::{AzureArmDouble, Azurite, TidemarkProcess, fails, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

async fn within(what: &str, secs: u64, mut check: impl AsyncFnMut() -> bool) {
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(secs) {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what} not within {secs} s");
}

fn storage_tokens(arm: &AzureArmDouble, how: &str) -> usize {
    arm.issued().iter().filter(|(h, aud)| h == how && aud == "https://storage.azure.com").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entra_identities_sign_in_to_the_data_plane_and_resource_manager_and_tokens_are_refreshed() {
    let arm = AzureArmDouble::start("tenant-1", "app-1", "app-secret-0123456789", &[(Azurite::ACCOUNT, "westeurope")]);
    let ca = arm.tls.ca.to_str().unwrap().to_string();
    // SAFETY: set before this test (its own process under nextest) makes any client or thread
    // that reads the environment; the test's own shared-key clients reach Azurite over HTTPS.
    unsafe { std::env::set_var("SSL_CERT_FILE", &ca) };
    let a = Azurite::start_oauth(&arm.tls);
    // Tokens that reach azure_identity's refresh point (five minutes before expiry) 3 s after
    // they are issued: while the subscription tails, each is used a few seconds, then replaced.
    arm.token_lifetime(Duration::from_secs(303));
    let container = unique_name("azid");
    let blobs = AzureBlobStorage::open(&a.conf("key"), &container).unwrap();
    blobs.create_container().await.unwrap();
    blobs.put("photos/before.txt", Bytes::from_static(b"before"), Default::default()).await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let federated = tmp.path().join("federated-token");
    std::fs::write(&federated, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6dGlkZW1hcmsifQ.c2ln")
        .unwrap();
    arm.federate("app-2", &std::fs::read_to_string(&federated).unwrap());
    let msi = arm.managed_identity("identity-header-secret");
    // The Azure CLI, as `azure_identity` runs it (`az account get-access-token -o json --scope
    // S`): a stand-in `az` on the PATH that answers with a token the double issued, in the CLI's
    // output format, and notes that it ran.
    let cli_token: serde_json::Value = arm
        .client()
        .post(format!("{}/tenant-1/oauth2/v2.0/token", arm.endpoint))
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", "app-1"),
            ("client_secret", "app-secret-0123456789"),
            ("scope", "https://storage.azure.com/.default"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let expires_on = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 300;
    let answer = serde_json::json!({"accessToken": cli_token["access_token"], "expires_on": expires_on,
        "tokenType": "Bearer", "tenant": "tenant-1"});
    let fake_bin = tmp.path().join("bin");
    std::fs::create_dir(&fake_bin).unwrap();
    std::fs::write(tmp.path().join("az-answer.json"), answer.to_string()).unwrap();
    let ran = tmp.path().join("az-ran");
    let az = fake_bin.join("az");
    std::fs::write(
        &az,
        format!(
            "#!/bin/sh
echo \"$@\" >> {}
cat {}
",
            ran.display(),
            tmp.path().join("az-answer.json").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&az, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", fake_bin.display(), std::env::var("PATH").unwrap_or_default());
    let server = TidemarkProcess::server_with_env(
        bin(),
        &tmp.path().join("data"),
        &[],
        &[
            ("SSL_CERT_FILE", &ca),
            ("IDENTITY_ENDPOINT", &msi),
            ("IDENTITY_HEADER", "identity-header-secret"),
            ("PATH", &path),
        ],
    );
    // `remote.mount` lists the bucket from the shell's own process: it signs in as the shell's
    // identity (here the same app's managed identity and CLI as the server's).
    let identity_env =
        [("IDENTITY_ENDPOINT", msi.as_str()), ("IDENTITY_HEADER", "identity-header-secret"), ("PATH", path.as_str())];
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &identity_env);
    let endpoints = format!(
        "-azure.account={} -azure.blob_endpoint={} -azure.queue_endpoint={} -azure.login_endpoint={3} \
         -azure.arm_endpoint={3} -azure.subscription_id=sub-1 -azure.resource_group=rg-1 -azure.tenant_id=tenant-1",
        Azurite::ACCOUNT,
        a.blob_endpoint,
        a.queue_endpoint,
        arm.endpoint
    );

    // A service principal's client secret, inferred (no key, no SAS): mount, read, write.
    ok(sh(&format!(
        "remote.configure -name=sp -type=azure {endpoints} -azure.client_id=app-1 -azure.client_secret=app-secret-0123456789"
    )));
    ok(sh(&format!("remote.mount -dir=/mnt/sp -remote=sp/{container}/photos")));
    assert_eq!(ok(sh("fs.cat /mnt/sp/before.txt")), "before");
    assert!(ok(sh("remote.sync.enable -dir=/mnt/sp")).contains("enabled"));
    let local = tmp.path().join("local.txt");
    std::fs::write(&local, b"written with a token").unwrap();
    ok(sh(&format!("fs.put {} /mnt/sp/local.txt", local.display())));
    within("the local write uploaded", 30, async || blobs.stat("photos/local.txt").await.is_ok_and(|o| o.is_some()))
        .await;
    assert!(storage_tokens(&arm, "client_secret") >= 1, "the data plane signed in with Entra: {:?}", arm.issued());

    // Events provisioned through Resource Manager with the same identity, and tailed.
    let out = ok(sh("remote.events.enable -dir=/mnt/sp -slice=6s -visibility=2s"));
    assert!(out.contains("provisioned sqs_direct tidemark-"), "{out}");
    assert!(
        arm.issued().iter().any(|(h, aud)| h == "client_secret" && *aud == arm.endpoint),
        "Resource Manager's audience asked for: {:?}",
        arm.issued()
    );
    within("the subscription to tail", 60, async || {
        ok(sh("remote.events.list")).lines().nth(1).is_some_and(|l| l.split('\t').nth(6) == Some("tailing"))
    })
    .await;
    let before_tail = storage_tokens(&arm, "client_secret");
    let deliver = async |name: &str| {
        let subject = format!("/blobServices/default/containers/{container}/blobs/{name}");
        for (_, q) in arm.deliveries("Microsoft.Storage.BlobCreated", &subject) {
            let message = serde_json::json!({
                "topic": format!("/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.Storage/storageAccounts/{}", Azurite::ACCOUNT),
                "subject": subject, "eventType": "Microsoft.Storage.BlobCreated",
                "eventTime": "2026-12-07T10:00:00.0000000Z", "id": unique_name("id"), "dataVersion": "",
                "metadataVersion": "1", "data": {"url": format!("{}/{container}/{name}", a.blob_endpoint)},
            });
            AzureQueueSource::open(&a.conf("key"), &q, Duration::from_secs(1))
                .unwrap()
                .put_message(&message.to_string())
                .await
                .unwrap();
        }
    };
    // Over 12 s of tailing, changes keep arriving and are applied: tokens are replaced as they
    // reach their refresh point, and none is refused.
    for i in 0..4 {
        let name = format!("photos/tail-{i}.txt");
        blobs.put(&name, Bytes::from(format!("change {i}")), Default::default()).await.unwrap();
        deliver(&name).await;
        within("the change applied", 30, async || sh(&format!("fs.cat /mnt/sp/tail-{i}.txt")).status.success()).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let refreshed = storage_tokens(&arm, "client_secret") - before_tail;
    assert!(refreshed >= 3, "tokens replaced while the subscription tailed ({refreshed})");
    let doc: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
    assert_eq!(doc[0]["status"]["failed"].as_u64().unwrap_or(0), 0, "nothing failed: {doc}");
    let out = ok(sh("remote.events.disable -dir=/mnt/sp -teardown"));
    assert!(out.contains("removed system topic"), "{out}");

    // A workload identity: the federated token file exchanged for an Entra token.
    ok(sh(&format!(
        "remote.configure -name=wi -type=azure {endpoints} -azure.client_id=app-2 -azure.federated_token_file={}",
        federated.display()
    )));
    ok(sh(&format!("remote.mount -dir=/mnt/wi -remote=wi/{container}/photos")));
    assert_eq!(ok(sh("fs.cat /mnt/wi/before.txt")), "before");
    assert!(storage_tokens(&arm, "workload_identity") >= 1, "{:?}", arm.issued());

    // The app's managed identity (App Service's endpoint), chosen explicitly.
    ok(sh(&format!("remote.configure -name=mi -type=azure {endpoints} -azure.identity=managed_identity")));
    ok(sh(&format!("remote.mount -dir=/mnt/mi -remote=mi/{container}/photos")));
    assert_eq!(ok(sh("fs.cat /mnt/mi/before.txt")), "before");
    assert!(storage_tokens(&arm, "managed_identity") >= 1, "{:?}", arm.issued());

    // The account `az login` signed in, chosen explicitly.
    ok(sh(&format!("remote.configure -name=cli -type=azure {endpoints} -azure.identity=azure_cli")));
    ok(sh(&format!("remote.mount -dir=/mnt/cli -remote=cli/{container}/photos")));
    assert_eq!(ok(sh("fs.cat /mnt/cli/before.txt")), "before");
    let asked = std::fs::read_to_string(&ran).unwrap();
    assert!(
        asked.contains("account get-access-token") && asked.contains("https://storage.azure.com/.default"),
        "{asked}"
    );

    // Refusals say what was refused and what to check; nothing is mounted.
    ok(sh(&format!(
        "remote.configure -name=bad -type=azure {endpoints} -azure.client_id=app-1 -azure.client_secret=wrong-secret-000"
    )));
    let err = fails(sh(&format!("remote.mount -dir=/mnt/bad -remote=bad/{container}/photos")));
    assert!(err.contains("AADSTS7000215") && err.contains("-azure.client_secret"), "{err}");
    ok(sh(&format!(
        "remote.configure -name=wi2 -type=azure {endpoints} -azure.client_id=app-1 -azure.identity=workload_identity -azure.federated_token_file={}",
        federated.display()
    )));
    let err = fails(sh(&format!("remote.mount -dir=/mnt/wi2 -remote=wi2/{container}/photos")));
    assert!(err.contains("AADSTS70021") && err.contains("federated"), "{err}");
    let err = fails(sh(&format!("remote.configure -name=odd -type=azure {endpoints} -azure.identity=password")));
    assert!(err.contains("-azure.identity=\"password\"") && err.contains("managed_identity"), "{err}");
    assert!(!ok(sh("remote.mount")).contains("/mnt/bad"));
}
