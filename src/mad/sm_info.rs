//! The SMInfo attribute (0x0020): what a subnet manager says of itself — its port GUID, SM_Key,
//! activity count, priority and state. A `SubnGet(SMInfo)` is answered by the SM software bound
//! to the addressed port (not by the HCA), so a Get to a port where no SM runs gets no answer.

use super::{be, check_len, MadError};

/// Byte ranges of SMInfo inside an SMP's attribute data.
pub mod field {
    use crate::mad::Field;
    /// The SM's port GUID.
    pub const GUID: Field = 0..8;
    /// SM_Key (zero unless the requester presented it).
    pub const SM_KEY: Field = 8..16;
    /// Activity count: incremented by a master as it works.
    pub const ACT_COUNT: Field = 16..20;
    /// Priority (high nibble) and SMState (low nibble).
    pub const PRIORITY_STATE: usize = 20;
    /// First byte after the attribute.
    pub const END: usize = 21;
}

/// SMState values (IBA 14.4.1).
pub mod sm_state {
    /// Not active.
    pub const NOT_ACTIVE: u8 = 0;
    /// Discovering.
    pub const DISCOVERING: u8 = 1;
    /// Standby.
    pub const STANDBY: u8 = 2;
    /// Master.
    pub const MASTER: u8 = 3;
}

/// A read/write view of SMInfo.
#[derive(Debug, Clone)]
pub struct SmInfo<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> SmInfo<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> SmInfo<T> {
        SmInfo { buffer }
    }
    /// Wraps a buffer, refusing one shorter than 21 bytes.
    pub fn new_checked(buffer: T) -> Result<SmInfo<T>, MadError> {
        check_len("SMInfo", buffer.as_ref(), field::END)?;
        Ok(SmInfo { buffer })
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// The SM's port GUID.
    pub fn guid(&self) -> u64 {
        be::u64_at(self.b(), field::GUID)
    }
    /// SM_Key.
    pub fn sm_key(&self) -> u64 {
        be::u64_at(self.b(), field::SM_KEY)
    }
    /// Activity count.
    pub fn act_count(&self) -> u32 {
        be::u32_at(self.b(), field::ACT_COUNT)
    }
    /// Priority (0-15).
    pub fn priority(&self) -> u8 {
        self.b()[field::PRIORITY_STATE] >> 4
    }
    /// SMState (see [`sm_state`]).
    pub fn sm_state(&self) -> u8 {
        self.b()[field::PRIORITY_STATE] & 0x0f
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SmInfo<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets the GUID.
    pub fn set_guid(&mut self, v: u64) {
        be::set_u64(self.m(), field::GUID, v);
    }
    /// Sets the SM_Key.
    pub fn set_sm_key(&mut self, v: u64) {
        be::set_u64(self.m(), field::SM_KEY, v);
    }
    /// Sets the activity count.
    pub fn set_act_count(&mut self, v: u32) {
        be::set_u32(self.m(), field::ACT_COUNT, v);
    }
    /// Sets the priority (low 4 bits of `priority`) and the state (low 4 bits of `state`).
    pub fn set_priority_state(&mut self, priority: u8, state: u8) {
        self.m()[field::PRIORITY_STATE] = (priority << 4) | (state & 0x0f);
    }
}

/// SMInfo as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmInfoRepr {
    /// The SM's port GUID.
    pub guid: u64,
    /// SM_Key.
    pub sm_key: u64,
    /// Activity count.
    pub act_count: u32,
    /// Priority (0-15).
    pub priority: u8,
    /// SMState (see [`sm_state`]).
    pub sm_state: u8,
}

impl SmInfoRepr {
    /// Reads SMInfo (only the length is checked, by [`SmInfo::new_checked`]; every 4-bit
    /// value decodes).
    pub fn parse<T: AsRef<[u8]>>(packet: &SmInfo<T>) -> Result<SmInfoRepr, MadError> {
        Ok(SmInfoRepr {
            guid: packet.guid(),
            sm_key: packet.sm_key(),
            act_count: packet.act_count(),
            priority: packet.priority(),
            sm_state: packet.sm_state(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        field::END
    }

    /// Writes the 21 bytes of SMInfo; a priority or state above 15 is refused.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut SmInfo<T>,
    ) -> Result<(), MadError> {
        for (name, v) in [("priority", self.priority), ("SMState", self.sm_state)] {
            if v > 0x0f {
                return Err(MadError::FieldRange {
                    what: "SMInfo",
                    field: name,
                    value: v.into(),
                });
            }
        }
        packet.set_guid(self.guid);
        packet.set_sm_key(self.sm_key);
        packet.set_act_count(self.act_count);
        packet.set_priority_state(self.priority, self.sm_state);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What OpenSM (priority 15, master, port GUID 0x100001) answered on the ibsim rig, as
    /// `sminfo -D 0` printed it: `sm lid 0 sm guid 0x100001, activity count 98 priority 15
    /// state 3 SMINFO_MASTER`.
    const MASTER: [u8; 21] = [
        0, 0, 0, 0, 0, 0x10, 0x00, 0x01, // GUID
        0, 0, 0, 0, 0, 0, 0, 0, // SM_Key
        0, 0, 0, 98,   // ActCount
        0xf3, // priority 15, MASTER
    ];

    #[test]
    fn decodes_priority_and_state_from_one_byte() {
        let r = SmInfoRepr::parse(&SmInfo::new_checked(&MASTER[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            SmInfoRepr {
                guid: 0x100001,
                sm_key: 0,
                act_count: 98,
                priority: 15,
                sm_state: sm_state::MASTER,
            }
        );
        let mut buf = [0xa5u8; field::END];
        r.emit(&mut SmInfo::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(buf, MASTER);
        let standby = SmInfoRepr {
            priority: 10,
            sm_state: sm_state::STANDBY,
            ..r
        };
        standby
            .emit(&mut SmInfo::new_unchecked(&mut buf[..]))
            .unwrap();
        assert_eq!(buf[field::PRIORITY_STATE], 0xa2);
    }

    #[test]
    fn out_of_range_and_truncated_are_refused() {
        let r = SmInfoRepr {
            guid: 1,
            sm_key: 0,
            act_count: 0,
            priority: 16,
            sm_state: 0,
        };
        let mut buf = [0u8; field::END];
        assert!(r.emit(&mut SmInfo::new_unchecked(&mut buf[..])).is_err());
        assert!(matches!(
            SmInfo::new_checked(&MASTER[..20]),
            Err(MadError::Truncated { needed: 21, .. })
        ));
    }
}
