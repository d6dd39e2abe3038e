//! Plain-text tables as kubectl prints them: upper-case headers, columns padded to their widest
//! cell, three spaces between.

/// Renders `rows` under `headers`; every row has one cell per header.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header_cells: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_cells).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = width - cell.chars().count() + 3;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_under_their_headers() {
        let table = render(
            &["NAME", "FREE"],
            &[
                vec!["rack-a".into(), "12".into()],
                vec!["b".into(), "340282366920938463463374607431768211456".into()],
            ],
        );
        assert_eq!(
            table,
            "NAME     FREE\n\
             rack-a   12\n\
             b        340282366920938463463374607431768211456\n"
        );
    }
}
