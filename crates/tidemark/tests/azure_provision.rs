//! `remote.events.enable` on an Azure mount, as a user runs it: Tidemark signs in as a service
//! principal, makes the storage queue (and its poison queue) on Azurite, the account's Event Grid
//! system topic and an event subscription of this cluster's through Resource Manager
//! (`tidemark_testkit::AzureArmDouble`: no emulator serves it), and tears them down. Event Grid
//! itself is played by the test: for a blob change it puts the event, in Event Grid's schema, on
//! the queues the double's event subscriptions say it would reach.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidemark_cloud::azure::{AzureBlobStorage, AzureQueueSource};
use tidemark_core::RemoteStorage;
use tidemark_testkit::{AzureArmDouble, Azurite, TidemarkProcess, fails, ok, run_shell, unique_name};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tidemark"))
}

/// Whether the queue `name` exists on Azurite.
async fn queue_exists(a: &Azurite, name: &str) -> bool {
    AzureQueueSource::open(&a.conf("az"), name, Duration::from_secs(1)).unwrap().exists().await.unwrap()
}

async fn within(what: &str, secs: u64, mut check: impl AsyncFnMut() -> bool) {
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(secs) {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} not within {secs} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_event_grid_delivery_is_provisioned_consumed_and_torn_down() {
    let a = Azurite::get();
    let arm = AzureArmDouble::start("tenant-1", "app-1", "app-secret-0123456789", &[(Azurite::ACCOUNT, "westeurope")]);
    let container = unique_name("azprov");
    let blobs = AzureBlobStorage::open(&a.conf("az"), &container).unwrap();
    blobs.create_container().await.unwrap();
    blobs.put("photos/before.txt", Bytes::from_static(b"before"), Default::default()).await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    // The double serves HTTPS (Microsoft's identity library refuses an authority that does not):
    // the server trusts its CA.
    let ca = arm.tls.ca.to_str().unwrap();
    let server = TidemarkProcess::server_with_env(bin(), &tmp.path().join("data"), &[], &[("SSL_CERT_FILE", ca)]);
    let sh = |cmd: &str| run_shell(bin(), &server.addr, cmd, &[("SSL_CERT_FILE", ca)]);
    ok(sh(&format!(
        "remote.configure -name=az -type=azure -azure.account={} -azure.account_key={} -azure.blob_endpoint={} -azure.queue_endpoint={}",
        Azurite::ACCOUNT,
        Azurite::KEY,
        a.blob_endpoint,
        a.queue_endpoint
    )));
    ok(sh(&format!("remote.mount -dir=/mnt/az -remote=az/{container}/photos")));
    // Without Resource Manager settings, the error names them; nothing is left behind.
    let err = fails(sh("remote.events.enable -dir=/mnt/az"));
    assert!(err.contains("-azure.subscription_id") && err.contains("-queue="), "{err}");
    let arm_settings = format!(
        "remote.configure -name=az -azure.subscription_id=sub-1 -azure.resource_group=rg-1 -azure.tenant_id=tenant-1 \
         -azure.client_id=app-1 -azure.arm_endpoint={0} -azure.login_endpoint={0}",
        arm.endpoint
    );
    // A wrong secret: refused at sign-in, said so, nothing made.
    ok(sh(&format!("{arm_settings} -azure.client_secret=wrong-secret-000")));
    let err = fails(sh("remote.events.enable -dir=/mnt/az"));
    assert!(err.contains("service principal") && err.contains("client_secret"), "{err}");
    assert!(arm.system_topics().is_empty() && arm.event_subscriptions().is_empty());
    ok(sh("remote.configure -name=az -azure.client_secret=app-secret-0123456789"));
    // The secret is one of the masked settings.
    let shown = ok(sh("fs.cat /etc/tidemark/remote/az.conf"));
    assert!(!shown.contains("app-secret-0123456789") && shown.contains("****6789"), "{shown}");

    let out = ok(sh("remote.events.enable -dir=/mnt/az -slice=6s -visibility=2s -maxReceives=3"));
    assert!(out.contains("provisioned sqs_direct tidemark-"), "{out}");
    let doc: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
    let managed = doc[0]["managed"].clone();
    let queue = managed["queue_url"].as_str().unwrap().to_string();
    let poison = managed["dead_letter_queue_url"].as_str().unwrap().to_string();
    assert_eq!(poison, format!("{queue}-poison"));
    assert!(managed["system_topic_created"].as_bool().unwrap());
    assert!(queue_exists(&a, &queue).await && queue_exists(&a, &poison).await);
    let topics = arm.system_topics();
    assert_eq!(topics.len(), 1);
    assert_eq!(topics[0]["location"], "westeurope");
    let subs = arm.event_subscriptions();
    assert_eq!(subs.len(), 1);
    let filter = &subs[0]["properties"]["filter"];
    assert_eq!(filter["subjectBeginsWith"], format!("/blobServices/default/containers/{container}/blobs/photos/"));
    assert!(filter["includedEventTypes"].to_string().contains("Microsoft.Storage.BlobCreated"));
    assert_eq!(filter["isSubjectCaseSensitive"], true, "blob names, and so the prefix, have case");
    // Event Grid's creates are long-running: the double answered `Creating` with an
    // `Azure-AsyncOperation`, and the enable waited for it to end.
    assert!(arm.polls() >= 2, "each operation followed to its end ({} polls)", arm.polls());
    assert_eq!(subs[0]["properties"]["provisioningState"], "Succeeded");

    // A second subscription of the account finds the system topic the first made, though
    // Resource Manager lists it on a later page (the double pages one topic at a time, and
    // another account's topic sorts first): one topic per account, shared, kept at its
    // teardown for the first.
    arm.add_system_topic("sub-1", "rg-1", "aaa-another-accounts", "anotheraccount", "westeurope");
    ok(sh(&format!("remote.mount -dir=/mnt/az2 -remote=az/{container}/docs")));
    // Resource Manager throttling (429, Retry-After) and another operation in progress (409
    // AnotherOperationInProgress) are waited out, not failures.
    arm.throttle(2);
    arm.busy(1);
    let out = ok(sh("remote.events.enable -dir=/mnt/az2 -slice=6s -visibility=2s"));
    assert!(out.contains("provisioned sqs_direct tidemark-"), "{out}");
    assert_eq!(arm.faults_left(), 0, "the 429s and the 409 were answered, and retried");
    assert_eq!(arm.system_topics().len(), 2, "ours found on the second page, not made again");
    assert_eq!(arm.event_subscriptions().len(), 2);
    let out = ok(sh("remote.events.disable -dir=/mnt/az2 -teardown"));
    assert!(out.contains("kept system topic") && out.contains("did not make it"), "{out}");
    assert_eq!(arm.system_topics().len(), 2, "kept for the first subscription");
    assert_eq!(arm.event_subscriptions().len(), 1);

    // An operation that fails after Resource Manager accepted it (Event Grid could not validate
    // the destination): the enable fails naming it, and what it made is taken back — the failed
    // event subscription and the queues.
    ok(sh(&format!("remote.mount -dir=/mnt/az3 -remote=az/{container}/third")));
    arm.fail_next_operation("DestinationValidationFailed", "The destination queue could not be validated.");
    let err = fails(sh("remote.events.enable -dir=/mnt/az3 -slice=6s"));
    assert!(err.contains("DestinationValidationFailed") && err.contains("ended Failed"), "{err}");
    assert!(err.contains("/eventSubscriptions/tidemark-"), "the operation's resource named: {err}");
    assert_eq!(arm.event_subscriptions().len(), 1, "the failed event subscription deleted");
    assert_eq!(arm.system_topics().len(), 2);
    assert!(!ok(sh("remote.events.list")).contains("/mnt/az3"), "no subscription recorded for /mnt/az3");

    // Event Grid's part: a blob created and one deleted, delivered where the subscription says.
    within("the subscription to tail", 60, async || {
        ok(sh("remote.events.list")).lines().nth(1).is_some_and(|l| l.split('\t').nth(6) == Some("tailing"))
    })
    .await;
    let deliver = async |event: &str, name: &str| {
        let subject = format!("/blobServices/default/containers/{container}/blobs/{name}");
        let targets = arm.deliveries(&format!("Microsoft.Storage.{event}"), &subject);
        for (_, q) in &targets {
            let message = serde_json::json!({
                "topic": format!("/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.Storage/storageAccounts/{}", Azurite::ACCOUNT),
                "subject": subject,
                "eventType": format!("Microsoft.Storage.{event}"),
                "eventTime": "2026-12-05T10:00:00.0000000Z",
                "id": unique_name("id"), "dataVersion": "", "metadataVersion": "1",
                "data": {"url": format!("{}/{container}/{name}", a.blob_endpoint)},
            });
            AzureQueueSource::open(&a.conf("az"), q, Duration::from_secs(1))
                .unwrap()
                .put_message(&message.to_string())
                .await
                .unwrap();
        }
        targets.len()
    };
    blobs.put("photos/new.txt", Bytes::from_static(b"through event grid"), Default::default()).await.unwrap();
    assert_eq!(deliver("BlobCreated", "photos/new.txt").await, 1);
    assert_eq!(deliver("BlobCreated", "other/outside.txt").await, 0, "the filter keeps the prefix");
    assert_eq!(deliver("BlobCreated", "PHOTOS/upper.txt").await, 0, "the prefix with its case");
    within("the new blob in the namespace", 30, async || sh("fs.cat /mnt/az/new.txt").status.success()).await;
    assert_eq!(ok(sh("fs.cat /mnt/az/new.txt")), "through event grid");
    blobs.delete("photos/before.txt").await.unwrap();
    assert_eq!(deliver("BlobDeleted", "photos/before.txt").await, 1);
    within("the deleted blob gone", 30, async || !ok(sh("fs.ls /mnt/az")).contains("before.txt")).await;
    // A message that never decodes is moved to the poison queue after -maxReceives receives.
    AzureQueueSource::open(&a.conf("az"), &queue, Duration::from_secs(1))
        .unwrap()
        .put_message("not an event")
        .await
        .unwrap();
    within("the poison message shown as dead", 90, async || {
        let doc: serde_json::Value = serde_json::from_str(&ok(sh("remote.events.list -json"))).unwrap();
        doc[0]["status"]["dead_lettered"].as_u64().unwrap_or(0) >= 1
    })
    .await;

    let out = ok(sh("remote.events.disable -dir=/mnt/az -teardown"));
    assert!(out.contains("removed system topic") && out.contains("no event subscription left"), "{out}");
    assert!(out.contains("with the 1 message(s) it still held"), "the poison queue's message said: {out}");
    assert!(arm.event_subscriptions().is_empty(), "all of it removed");
    let left: Vec<_> = arm.system_topics().iter().map(|t| t["name"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(left, ["aaa-another-accounts"], "the topic Tidemark made removed, another's kept");
    assert!(!queue_exists(&a, &queue).await && !queue_exists(&a, &poison).await, "the queues removed");
}
