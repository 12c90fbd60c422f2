//! Typed keyed state over any [`KeyedStateBackend`], encoded with bincode (serde).
//!
//! A state is a small descriptor (its name); every call names the key group, the key
//! and the namespace (the window; `&()` for none) and borrows the backend, so one
//! backend serves all the states of an operator.
//!
//! ```
//! use caudal_checkpoints::{HeapStateBackend, KeyGroupRange, ValueState};
//! let mut backend = HeapStateBackend::new(KeyGroupRange::all(128));
//! let count: ValueState<String, u64> = ValueState::new("count")?;
//! count.put(&mut backend, 7, &"sensor-1".to_string(), &(), &3)?;
//! assert_eq!(count.get(&backend, 7, &"sensor-1".to_string(), &())?, Some(3));
//! # Ok::<(), caudal_checkpoints::Error>(())
//! ```

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::backend::{decode_list, KeyedStateBackend};
use crate::keys::{decode_key, StateId, StateKey};
use crate::{Error, Result};

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

fn encode<T: Serialize + ?Sized>(state: &StateId, value: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(value, config())
        .map_err(|e| Error::Codec { state: state.name().to_string(), reason: e.to_string() })
}

fn decode<T: DeserializeOwned>(state: &StateId, bytes: &[u8]) -> Result<T> {
    bincode::serde::decode_from_slice(bytes, config())
        .map(|(v, _)| v)
        .map_err(|e| Error::Codec { state: state.name().to_string(), reason: e.to_string() })
}

/// One value per (key, namespace).
#[derive(Debug, Clone)]
pub struct ValueState<K, V> {
    id: StateId,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K: Serialize, V: Serialize + DeserializeOwned> ValueState<K, V> {
    /// A value state named `name` (1-255 bytes, unique within the operator).
    pub fn new(name: &str) -> Result<Self> {
        Ok(ValueState { id: StateId::new(name)?, _types: PhantomData })
    }

    /// The state's id.
    pub fn id(&self) -> &StateId {
        &self.id
    }

    /// The value, if set.
    pub fn get<B, N>(&self, backend: &B, key_group: u16, key: &K, namespace: &N) -> Result<Option<V>>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns) = (encode(&self.id, key)?, encode(&self.id, namespace)?);
        let sk = scoped(key_group, &self.id, &k, &ns);
        backend.get(&sk)?.map(|v| decode(&self.id, &v)).transpose()
    }

    /// Sets the value.
    pub fn put<B, N>(&self, backend: &mut B, key_group: u16, key: &K, namespace: &N, value: &V) -> Result<()>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns, v) = (encode(&self.id, key)?, encode(&self.id, namespace)?, encode(&self.id, value)?);
        backend.put(&scoped(key_group, &self.id, &k, &ns), &v)
    }

    /// Removes the value.
    pub fn clear<B, N>(&self, backend: &mut B, key_group: u16, key: &K, namespace: &N) -> Result<()>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns) = (encode(&self.id, key)?, encode(&self.id, namespace)?);
        backend.delete(&scoped(key_group, &self.id, &k, &ns))
    }
}

fn scoped<'a>(key_group: u16, state: &'a StateId, key: &'a [u8], namespace: &'a [u8]) -> StateKey<'a> {
    StateKey { key_group, state, key, namespace, map_key: &[] }
}

type MapTypes<K, UK, V> = fn() -> (K, UK, V);

/// A map per (key, namespace); each map entry is one backend entry.
#[derive(Debug, Clone)]
pub struct MapState<K, UK, V> {
    id: StateId,
    _types: PhantomData<MapTypes<K, UK, V>>,
}

impl<K: Serialize, UK: Serialize + DeserializeOwned, V: Serialize + DeserializeOwned> MapState<K, UK, V> {
    /// A map state named `name`.
    pub fn new(name: &str) -> Result<Self> {
        Ok(MapState { id: StateId::new(name)?, _types: PhantomData })
    }

    /// The state's id.
    pub fn id(&self) -> &StateId {
        &self.id
    }

    /// The value of `map_key`.
    pub fn get<B, N>(
        &self,
        backend: &B,
        key_group: u16,
        key: &K,
        namespace: &N,
        map_key: &UK,
    ) -> Result<Option<V>>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns, mk) = (encode(&self.id, key)?, encode(&self.id, namespace)?, encode(&self.id, map_key)?);
        let mut sk = scoped(key_group, &self.id, &k, &ns);
        sk.map_key = &mk;
        backend.get(&sk)?.map(|v| decode(&self.id, &v)).transpose()
    }

    /// Sets `map_key` to `value`.
    pub fn insert<B, N>(
        &self,
        backend: &mut B,
        key_group: u16,
        key: &K,
        namespace: &N,
        map_key: &UK,
        value: &V,
    ) -> Result<()>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns, mk, v) = (
            encode(&self.id, key)?,
            encode(&self.id, namespace)?,
            encode(&self.id, map_key)?,
            encode(&self.id, value)?,
        );
        let mut sk = scoped(key_group, &self.id, &k, &ns);
        sk.map_key = &mk;
        backend.put(&sk, &v)
    }

    /// Removes `map_key`.
    pub fn remove<B, N>(
        &self,
        backend: &mut B,
        key_group: u16,
        key: &K,
        namespace: &N,
        map_key: &UK,
    ) -> Result<()>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns, mk) = (encode(&self.id, key)?, encode(&self.id, namespace)?, encode(&self.id, map_key)?);
        let mut sk = scoped(key_group, &self.id, &k, &ns);
        sk.map_key = &mk;
        backend.delete(&sk)
    }

    /// All entries of the map, in the order of their encoded map keys.
    pub fn entries<B, N>(&self, backend: &B, key_group: u16, key: &K, namespace: &N) -> Result<Vec<(UK, V)>>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns) = (encode(&self.id, key)?, encode(&self.id, namespace)?);
        let raw = backend.scan_map(&scoped(key_group, &self.id, &k, &ns))?;
        raw.iter()
            .map(|e| {
                let d = decode_key(&e.key).ok_or_else(|| Error::Codec {
                    state: self.id.name().to_string(),
                    reason: "stored key does not follow the key layout".into(),
                })?;
                Ok((decode(&self.id, d.map_key)?, decode(&self.id, &e.value)?))
            })
            .collect()
    }

    /// Removes every entry of the map.
    pub fn clear<B, N>(&self, backend: &mut B, key_group: u16, key: &K, namespace: &N) -> Result<()>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns) = (encode(&self.id, key)?, encode(&self.id, namespace)?);
        backend.delete_map(&scoped(key_group, &self.id, &k, &ns))
    }
}

/// A list per (key, namespace); `add` appends without reading (RocksDB merge).
#[derive(Debug, Clone)]
pub struct ListState<K, V> {
    id: StateId,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K: Serialize, V: Serialize + DeserializeOwned> ListState<K, V> {
    /// A list state named `name`.
    pub fn new(name: &str) -> Result<Self> {
        Ok(ListState { id: StateId::new(name)?, _types: PhantomData })
    }

    /// The state's id.
    pub fn id(&self) -> &StateId {
        &self.id
    }

    /// Appends one element.
    pub fn add<B, N>(&self, backend: &mut B, key_group: u16, key: &K, namespace: &N, value: &V) -> Result<()>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns, v) = (encode(&self.id, key)?, encode(&self.id, namespace)?, encode(&self.id, value)?);
        backend.append(&scoped(key_group, &self.id, &k, &ns), &v)
    }

    /// The elements in insertion order (empty when unset).
    pub fn get<B, N>(&self, backend: &B, key_group: u16, key: &K, namespace: &N) -> Result<Vec<V>>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns) = (encode(&self.id, key)?, encode(&self.id, namespace)?);
        match backend.get(&scoped(key_group, &self.id, &k, &ns))? {
            None => Ok(Vec::new()),
            Some(raw) => decode_list(&raw)?.into_iter().map(|el| decode(&self.id, el)).collect(),
        }
    }

    /// Replaces the list.
    pub fn update<B, N>(
        &self,
        backend: &mut B,
        key_group: u16,
        key: &K,
        namespace: &N,
        values: &[V],
    ) -> Result<()>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns) = (encode(&self.id, key)?, encode(&self.id, namespace)?);
        let mut raw = Vec::new();
        for v in values {
            raw.extend_from_slice(&crate::backend::frame_list_element(&encode(&self.id, v)?));
        }
        let sk = scoped(key_group, &self.id, &k, &ns);
        if values.is_empty() {
            backend.delete(&sk)
        } else {
            backend.put(&sk, &raw)
        }
    }

    /// Removes the list.
    pub fn clear<B, N>(&self, backend: &mut B, key_group: u16, key: &K, namespace: &N) -> Result<()>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns) = (encode(&self.id, key)?, encode(&self.id, namespace)?);
        backend.delete(&scoped(key_group, &self.id, &k, &ns))
    }
}

/// An accumulator per (key, namespace), e.g. the running sum and count of a window.
#[derive(Debug, Clone)]
pub struct AggregatingState<K, ACC> {
    id: StateId,
    _types: PhantomData<fn() -> (K, ACC)>,
}

impl<K: Serialize, ACC: Serialize + DeserializeOwned + Default> AggregatingState<K, ACC> {
    /// An aggregating state named `name`.
    pub fn new(name: &str) -> Result<Self> {
        Ok(AggregatingState { id: StateId::new(name)?, _types: PhantomData })
    }

    /// The state's id.
    pub fn id(&self) -> &StateId {
        &self.id
    }

    /// Folds one input into the accumulator (starting from `ACC::default()`) and
    /// returns the new accumulator.
    pub fn add<B, N, F>(
        &self,
        backend: &mut B,
        key_group: u16,
        key: &K,
        namespace: &N,
        fold: F,
    ) -> Result<ACC>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
        F: FnOnce(&mut ACC),
    {
        let (k, ns) = (encode(&self.id, key)?, encode(&self.id, namespace)?);
        let sk = scoped(key_group, &self.id, &k, &ns);
        let mut acc = match backend.get(&sk)? {
            Some(raw) => decode(&self.id, &raw)?,
            None => ACC::default(),
        };
        fold(&mut acc);
        backend.put(&sk, &encode(&self.id, &acc)?)?;
        Ok(acc)
    }

    /// The accumulator, if any input was added.
    pub fn get<B, N>(&self, backend: &B, key_group: u16, key: &K, namespace: &N) -> Result<Option<ACC>>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns) = (encode(&self.id, key)?, encode(&self.id, namespace)?);
        backend.get(&scoped(key_group, &self.id, &k, &ns))?.map(|v| decode(&self.id, &v)).transpose()
    }

    /// Removes the accumulator (after the window fired).
    pub fn clear<B, N>(&self, backend: &mut B, key_group: u16, key: &K, namespace: &N) -> Result<()>
    where
        B: KeyedStateBackend + ?Sized,
        N: Serialize + ?Sized,
    {
        let (k, ns) = (encode(&self.id, key)?, encode(&self.id, namespace)?);
        backend.delete(&scoped(key_group, &self.id, &k, &ns))
    }
}
