//! The rows of the open epoch, column by column: what one `INSERT … SELECT * FROM
//! unnest($1, $2, …)` sends, and what is sent again if the connection breaks before the
//! epoch's transaction is prepared.

use super::row::{SqlType, SqlValue};
use std::collections::HashMap;
use tokio_postgres::types::ToSql;

/// The shape of the table: column names and types, from the first record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Shape {
    pub names: Vec<&'static str>,
    pub types: Vec<SqlType>,
}

impl Shape {
    pub(crate) fn of(row: &[(&'static str, SqlValue)]) -> Shape {
        Shape {
            names: row.iter().map(|(n, _)| *n).collect(),
            types: row.iter().map(|(_, v)| v.sql_type()).collect(),
        }
    }
}

#[derive(Debug)]
enum Column {
    BigInt(Vec<i64>),
    Double(Vec<f64>),
    Bool(Vec<bool>),
    Text(Vec<String>),
}

/// A part of a key, hashable (floats by their bits).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum KeyPart {
    I(i64),
    F(u64),
    B(bool),
    T(String),
}

/// Rows of one epoch.
#[derive(Debug)]
pub(crate) struct RowBuffer {
    shape: Shape,
    columns: Vec<Column>,
    key: Vec<usize>,
    len: usize,
}

impl RowBuffer {
    /// An empty buffer of `shape`; `key` are the positions of the key columns.
    pub(crate) fn new(shape: Shape, key: Vec<usize>) -> Self {
        let columns = shape
            .types
            .iter()
            .map(|t| match t {
                SqlType::BigInt => Column::BigInt(Vec::new()),
                SqlType::Double => Column::Double(Vec::new()),
                SqlType::Bool => Column::Bool(Vec::new()),
                SqlType::Text => Column::Text(Vec::new()),
            })
            .collect();
        RowBuffer { shape, columns, key, len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn clear(&mut self) {
        for c in &mut self.columns {
            match c {
                Column::BigInt(v) => v.clear(),
                Column::Double(v) => v.clear(),
                Column::Bool(v) => v.clear(),
                Column::Text(v) => v.clear(),
            }
        }
        self.len = 0;
    }

    /// Appends a row; an error names the field whose name or type differs from the table's.
    pub(crate) fn push(&mut self, row: &mut Vec<(&'static str, SqlValue)>) -> Result<(), String> {
        if row.len() != self.columns.len() {
            return Err(format!(
                "a record has {} fields, the table's rows have {} ({})",
                row.len(),
                self.columns.len(),
                self.shape.names.join(", ")
            ));
        }
        for (i, (name, _)) in row.iter().enumerate() {
            if *name != self.shape.names[i] {
                return Err(format!(
                    "field {i} is `{name}`, the table's column is `{}`",
                    self.shape.names[i]
                ));
            }
        }
        for (i, (name, value)) in row.drain(..).enumerate() {
            match (&mut self.columns[i], value) {
                (Column::BigInt(c), SqlValue::BigInt(v)) => c.push(v),
                (Column::Double(c), SqlValue::Double(v)) => c.push(v),
                (Column::Bool(c), SqlValue::Bool(v)) => c.push(v),
                (Column::Text(c), SqlValue::Text(v)) => c.push(v),
                (_, v) => {
                    // Roll back the columns already pushed for this row.
                    for c in &mut self.columns[..i] {
                        match c {
                            Column::BigInt(v) => drop(v.pop()),
                            Column::Double(v) => drop(v.pop()),
                            Column::Bool(v) => drop(v.pop()),
                            Column::Text(v) => drop(v.pop()),
                        }
                    }
                    return Err(format!(
                        "field `{name}` is {:?}, the column is {}",
                        v.sql_type(),
                        self.shape.types[i].ddl()
                    ));
                }
            }
        }
        self.len += 1;
        Ok(())
    }

    fn key_of(&self, row: usize) -> Vec<KeyPart> {
        self.key
            .iter()
            .map(|&c| match &self.columns[c] {
                Column::BigInt(v) => KeyPart::I(v[row]),
                Column::Double(v) => KeyPart::F(v[row].to_bits()),
                Column::Bool(v) => KeyPart::B(v[row]),
                Column::Text(v) => KeyPart::T(v[row].clone()),
            })
            .collect()
    }

    /// The rows of `range` to send in one statement: the last row of each key (an upsert
    /// statement may touch a row once).
    pub(crate) fn distinct_rows(&self, range: std::ops::Range<usize>) -> Vec<usize> {
        let mut last: HashMap<Vec<KeyPart>, usize> = HashMap::with_capacity(range.len());
        for r in range.clone() {
            last.insert(self.key_of(r), r);
        }
        if last.len() == range.len() {
            return range.collect();
        }
        let mut rows: Vec<usize> = last.into_values().collect();
        rows.sort_unstable();
        rows
    }

    /// One array parameter per column holding `rows`.
    pub(crate) fn params(&self, rows: &[usize]) -> Vec<Box<dyn ToSql + Sync + Send>> {
        self.columns
            .iter()
            .map(|c| -> Box<dyn ToSql + Sync + Send> {
                match c {
                    Column::BigInt(v) => Box::new(rows.iter().map(|&r| v[r]).collect::<Vec<i64>>()),
                    Column::Double(v) => Box::new(rows.iter().map(|&r| v[r]).collect::<Vec<f64>>()),
                    Column::Bool(v) => Box::new(rows.iter().map(|&r| v[r]).collect::<Vec<bool>>()),
                    Column::Text(v) => Box::new(rows.iter().map(|&r| v[r].clone()).collect::<Vec<String>>()),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, ts: i64, c: f64) -> Vec<(&'static str, SqlValue)> {
        vec![("id", SqlValue::BigInt(id)), ("ts", SqlValue::BigInt(ts)), ("c", SqlValue::Double(c))]
    }

    #[test]
    fn duplicate_keys_keep_the_last_row() {
        let mut b = RowBuffer::new(Shape::of(&row(0, 0, 0.0)), vec![0, 1]);
        for (id, ts, c) in [(1, 1, 1.0), (2, 1, 2.0), (1, 1, 3.0), (1, 2, 4.0)] {
            b.push(&mut row(id, ts, c)).unwrap();
        }
        assert_eq!(b.distinct_rows(0..4), vec![1, 2, 3]);
        assert_eq!(b.distinct_rows(0..2), vec![0, 1]);
    }

    #[test]
    fn a_row_of_another_shape_is_refused_whole() {
        let mut b = RowBuffer::new(Shape::of(&row(0, 0, 0.0)), vec![0]);
        let mut bad =
            vec![("id", SqlValue::BigInt(1)), ("ts", SqlValue::BigInt(1)), ("c", SqlValue::Text("x".into()))];
        let e = b.push(&mut bad).unwrap_err();
        assert!(e.contains("`c`"), "{e}");
        assert_eq!(b.len(), 0);
        b.push(&mut row(1, 1, 1.0)).unwrap();
        assert_eq!(b.distinct_rows(0..1), vec![0]);
    }
}
