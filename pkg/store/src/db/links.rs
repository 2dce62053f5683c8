//! The `link_settings` table: what an operator set on a wire end at run time
//! (`weftctl link set|reset|down|up`), which overrides the topology until reset and
//! survives restarts.

use std::collections::HashMap;

use rusqlite::params;
use weft_link::{DownBy, EndSettings, Impairment};

use super::{Db, now_ms};
use crate::StoreError;

impl Db {
    /// Records the run-time settings of wire end `id`; empty settings remove the row.
    pub fn put_link_settings(&mut self, id: u64, s: &EndSettings) -> Result<(), StoreError> {
        let tx = self.immediate()?;
        if s.is_empty() {
            tx.prepare_cached("DELETE FROM link_settings WHERE id = ?1")?
                .execute(params![id as i64])?;
        } else {
            tx.prepare_cached(
                "INSERT INTO link_settings (id, impairment, down, updated_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (id) DO UPDATE SET impairment = ?2, down = ?3, updated_at = ?4",
            )?
            .execute(params![
                id as i64,
                s.impairment.as_ref().map(impairment_text),
                s.down.map(DownBy::as_str),
                now_ms()
            ])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The run-time settings of every wire end that has some.
    pub fn link_settings(&mut self) -> Result<HashMap<u64, EndSettings>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id, impairment, down FROM link_settings")?;
        let mut rows = stmt.query([])?;
        let mut out = HashMap::new();
        while let Some(r) = rows.next()? {
            let id = r.get::<_, i64>(0)? as u64;
            let bad = |what: String| StoreError::BadLinkSettings { id, what };
            let impairment = r
                .get::<_, Option<String>>(1)?
                .map(|t| parse_impairment(&t).map_err(|e| bad(e.to_string())))
                .transpose()?;
            let down = r
                .get::<_, Option<String>>(2)?
                .map(|d| DownBy::parse(&d).ok_or_else(|| bad(format!("down {d:?}"))))
                .transpose()?;
            out.insert(id, EndSettings { impairment, down });
        }
        Ok(out)
    }
}

/// An impairment as the column holds it: `param=value` pairs joined by `,`.
fn impairment_text(i: &Impairment) -> String {
    i.params()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_impairment(t: &str) -> Result<Impairment, weft_link::ImpairmentError> {
    Impairment::from_params(t.split(',').filter(|p| !p.is_empty()).map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        (k, v)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_empty_ones_go() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = Db::open(&dir.path().join("s.db")).unwrap();
        let imp = Impairment::from_params([("delay", "20ms"), ("loss", "1.5%"), ("rate", "50mbit")]).unwrap();
        let a = EndSettings {
            impairment: Some(imp),
            down: None,
        };
        let b = EndSettings {
            impairment: Some(Impairment::default()),
            down: Some(DownBy::Peer),
        };
        db.put_link_settings(7, &a).unwrap();
        db.put_link_settings(u64::MAX, &b).unwrap();
        let got = db.link_settings().unwrap();
        assert_eq!((got[&7], got[&u64::MAX]), (a, b));
        db.put_link_settings(7, &EndSettings::default()).unwrap();
        assert_eq!(db.link_settings().unwrap().len(), 1);
    }
}
