//! RFC 3339 times, as JetStream's JSON carries them (`2026-12-02T13:10:54.5Z`), to and
//! from milliseconds since the Unix epoch. Only what JetStream clients send and read:
//! UTC `Z` or a `±hh:mm` offset, with or without fractional seconds.

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn format(ms: u64) -> String {
    let days = (ms / 86_400_000) as i64;
    let in_day = ms % 86_400_000;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000
    )
}

/// Milliseconds since the epoch of an RFC 3339 time; None when it is not one, or
/// before the epoch.
pub fn parse(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if bytes.len() < 20
        || bytes[4] != b'-'
        || bytes[7] != b'-'
        || !matches!(bytes[10], b'T' | b't' | b' ')
    {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    if bytes[13] != b':' || bytes[16] != b':' {
        return None;
    }
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let first3: String = fraction[..digits]
            .chars()
            .chain("000".chars())
            .take(3)
            .collect();
        millis = first3.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        offset
            if offset.len() == 6
                && matches!(offset.as_bytes()[0], b'+' | b'-')
                && offset.as_bytes()[3] == b':' =>
        {
            let hours: i64 = offset.get(1..3)?.parse().ok()?;
            let minutes: i64 = offset.get(4..6)?.parse().ok()?;
            let sign = if offset.starts_with('-') { -1 } else { 1 };
            sign * (hours * 60 + minutes)
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let total = ((days * 24 + hour) * 60 + minute - offset_minutes) * 60 + second;
    let ms = total.checked_mul(1_000)?.checked_add(millis)?;
    u64::try_from(ms).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date of a day since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_go_both_ways() {
        assert_eq!(format(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format(1_796_217_054_500), "2026-12-02T13:10:54.500Z");
        assert_eq!(parse("2026-12-02T13:10:54.500Z"), Some(1_796_217_054_500));
        assert_eq!(
            parse("2026-12-02T13:10:54.5004321Z"),
            Some(1_796_217_054_500)
        );
        assert_eq!(
            parse("2026-12-02T14:10:54.5+01:00"),
            Some(1_796_217_054_500)
        );
        assert_eq!(parse("2026-12-02T13:10:54Z"), Some(1_796_217_054_000));
        assert_eq!(
            parse("2024-02-29T00:00:00Z").map(format).as_deref(),
            Some("2024-02-29T00:00:00.000Z")
        );
        for bad in [
            "",
            "2026-12-02",
            "2026-13-02T00:00:00Z",
            "2026-12-02T13:10:54",
            "1969-12-31T23:59:59Z",
            "2026-12-02T13:10:54.Z",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_day_of_four_centuries_round_trips() {
        for days in (-719_468..200_000).step_by(97) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
