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
