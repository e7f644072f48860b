//! The store's format record: a newer format or foreign data is refused.

use super::*;

#[tokio::test]
async fn a_newer_format_or_foreign_data_is_refused() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    {
        let db = slatedb::Db::open("db", Arc::clone(&inner))
            .await
            .expect("db");
        db.put(keys::FORMAT_KEY, 99u64.to_be_bytes())
            .await
            .expect("put");
        db.close().await.expect("close");
    }
    let error = Store::open(settings(inner), Arc::new(Recorder::default()))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(error, StoreError::NewerFormat { found: 99, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("newer canopy"), "{error}");

    let foreign: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    {
        let db = slatedb::Db::open("db", Arc::clone(&foreign))
            .await
            .expect("db");
        db.put(b"something", b"else").await.expect("put");
        db.close().await.expect("close");
    }
    let error = Store::open(settings(foreign), Arc::new(Recorder::default()))
        .await
        .err()
        .expect("refused");
    assert!(matches!(error, StoreError::Foreign), "{error}");
}

#[tokio::test]
async fn a_format_1_store_opens_and_is_marked_format_2() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    {
        let db = slatedb::Db::open("db", Arc::clone(&inner))
            .await
            .expect("db");
        db.put(keys::FORMAT_KEY, 1u64.to_be_bytes())
            .await
            .expect("put");
        // A format 1 message: a bare record under its version.
        db.put(
            keys::message("t", "a", 1),
            record::encode_record(1, 5, 0, b"", b"old"),
        )
        .await
        .expect("put");
        db.close().await.expect("close");
    }
    let store = Store::open(settings(inner), Arc::new(Recorder::default()))
        .await
        .expect("opens");
    let format = store
        .db()
        .get(keys::FORMAT_KEY)
        .await
        .expect("reads")
        .expect("a format record");
    assert_eq!(&format[..], &FORMAT_VERSION.to_be_bytes());
    assert_eq!(FORMAT_VERSION, 2);
    let old = store
        .get("t", "a", Some(1))
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(&old.payload[..], b"old");
    store.close().await.expect("closes");
}
