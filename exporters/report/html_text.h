#pragma once
// Text for the HTML report: escaping of names (a model's node and tensor names may hold <, &,
// quotes) and numbers written the same way on every machine (std::to_chars, no locale).
#include <string>
#include <string_view>

namespace qforge::report {

// &, <, >, " and ' as character references: safe in element content and in quoted attributes.
std::string escape_html(std::string_view text);

// JSON text for a <script type="application/json"> block: every <, > and & as \u003c, \u003e,
// \u0026 (they only occur inside JSON strings, where these escapes are valid), so no "</script"
// or "<!--" can end or alter the block.
std::string escape_script_json(std::string_view json);

// `text` as one CSS class name: ASCII letters, digits, '-' and '_' kept, every other byte '-'
// ("prec-int4 block" -> "prec-int4-block"), so a name from the data cannot add classes or leave
// the attribute.
std::string css_token(std::string_view text);

// The shortest text that reads back as `v` ("0.1", "1e-05"); "inf", "-inf", "nan".
std::string number_exact(double v);
// `v` with `decimals` digits after the point ("31.50"); "inf", "-inf", "nan".
std::string number_fixed(double v, int decimals);
// `v` with `digits` significant digits, %g style ("0.000123", "1.5e+06"); "inf", "-inf", "nan".
std::string number_general(double v, int digits);

// `name` cut to at most `max_chars` characters (UTF-8 sequences kept whole), keeping its end,
// which tells layers apart ("…/layer.3/output/dense/MatMul").
std::string shorten_name(std::string_view name, size_t max_chars);

}  // namespace qforge::report
