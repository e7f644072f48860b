//! Issue 30: async-nats's Object Store (`jetstream::object_store`), unmodified,
//! against Canopy: a bucket made, an object of several chunks put and read back
//! whole, listed, replaced, deleted, and the bucket deleted. An object store is a
//! stream over `$O.<bucket>.C.>` and `$O.<bucket>.M.>`; nothing on the server is
//! specific to it.

use async_nats::jetstream::{self, object_store};
use futures::StreamExt;
use tokio::io::AsyncReadExt;

use crate::common::{WAIT, start_default};

async fn within<T>(what: &str, step: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, step)
        .await
        .unwrap_or_else(|_| panic!("{what} answered in time"))
}

async fn read(bucket: &object_store::ObjectStore, name: &str) -> Vec<u8> {
    let mut object = within("get", bucket.get(name)).await.expect("get");
    let mut back = Vec::new();
    within("read", object.read_to_end(&mut back))
        .await
        .expect("read");
    back
}

#[tokio::test]
async fn async_nats_object_store_works_against_canopy() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connects");
    let js = jetstream::new(client);
    let bucket = within(
        "create_object_store",
        js.create_object_store(object_store::Config {
            bucket: "files".into(),
            ..Default::default()
        }),
    )
    .await
    .expect("a bucket is made");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let info = within("put", bucket.put("a/file.bin", &mut data.as_slice()))
        .await
        .expect("put");
    assert_eq!(info.size, data.len());
    assert!(info.chunks > 1, "{info:?}");
    assert_eq!(read(&bucket, "a/file.bin").await, data);

    let list = within("list", bucket.list()).await.expect("list");
    let names: Vec<String> = within(
        "list",
        list.map(|o| o.expect("an object").name).collect::<Vec<_>>(),
    )
    .await;
    assert_eq!(names, ["a/file.bin"]);

    within("put", bucket.put("a/file.bin", &mut &b"smaller now"[..]))
        .await
        .expect("a replacing put");
    assert_eq!(read(&bucket, "a/file.bin").await, b"smaller now");
    within("delete", bucket.delete("a/file.bin"))
        .await
        .expect("delete");
    assert!(
        within("get", bucket.get("a/file.bin")).await.is_err(),
        "a deleted object is gone"
    );
    within("delete_object_store", js.delete_object_store("files"))
        .await
        .expect("the bucket is deleted");
    server.stop().await;
}
