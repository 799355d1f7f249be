package sagapic

import (
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// xmlText escapes s for XML text and attribute values: the five markup
// characters, tab and newline become references, and what XML 1.0 cannot
// hold (other control characters, invalid UTF-8) becomes U+FFFD.
func xmlText(s string) string {
	var b strings.Builder
	for i, w := 0, 0; i < len(s); i += w {
		r, size := utf8.DecodeRuneInString(s[i:])
		w = size
		switch {
		case r == utf8.RuneError && size <= 1:
			b.WriteRune('\uFFFD')
		case r == '&':
			b.WriteString("&amp;")
		case r == '<':
			b.WriteString("&lt;")
		case r == '>':
			b.WriteString("&gt;")
		case r == '"':
			b.WriteString("&quot;")
		case r == '\'':
			b.WriteString("&#39;")
		case r == '\t':
			b.WriteString("&#9;")
		case r == '\n':
			b.WriteString("&#10;") // kept in attributes too
		case unicode.IsControl(r) || r == '\uFFFE' || r == '\uFFFF':
			b.WriteRune('\uFFFD')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// dotString quotes s as a Graphviz double-quoted string: a backslash (which
// starts Graphviz's escapes, \N, \l…) and a double quote are escaped, line
// breaks become \n and other control characters and invalid UTF-8 U+FFFD.
func dotString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range clean(s) {
		switch r {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// mermaidText escapes s for a double-quoted Mermaid label: every character
// that Mermaid or the HTML it renders labels into reads as syntax (quotes,
// markup, entity starts, backticks, brackets, pipes, semicolons, the
// percent sign of comments) becomes a
// numeric entity code (#34;), and line breaks a space.
func mermaidText(s string) string {
	var b strings.Builder
	for _, r := range clean(s) {
		switch r {
		case '"', '#', '&', '<', '>', '`', '\'', ';', '[', ']', '{', '}', '(', ')', '|', '\\', '%':
			b.WriteString("#" + strconv.Itoa(int(r)) + ";")
		case '\n':
			b.WriteByte(' ')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// clean replaces invalid UTF-8 and control characters other than newline
// with U+FFFD, and a tab with a space.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\t':
			return ' '
		case r == '\n':
			return r
		case r == utf8.RuneError || unicode.IsControl(r):
			return '\uFFFD'
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}

// textWidth estimates the width in pixels of s in a sans-serif font of
// size px (bold a little wider). No font is measured: the estimate is on
// the wide side, and text that would not fit is cut by fit.
func textWidth(s string, px float64, bold bool) float64 {
	em := 0.0
	for _, r := range s {
		switch {
		case strings.ContainsRune("iljtfrI.,:;|!' ()[]", r):
			em += 0.34
		case strings.ContainsRune("mwMW@%", r):
			em += 0.9
		case unicode.IsUpper(r) || unicode.IsDigit(r):
			em += 0.68
		case r > 0x2E80: // wide scripts
			em += 1.0
		default:
			em += 0.58
		}
	}
	if bold {
		em *= 1.08
	}
	return em * px
}

// fit cuts s, ending it with an ellipsis, so that it is at most width
// pixels wide in a font of size px.
func fit(s string, width, px float64, bold bool) string {
	s = strings.ReplaceAll(clean(s), "\n", " ")
	if textWidth(s, px, bold) <= width {
		return s
	}
	runes := []rune(s)
	for n := len(runes) - 1; n > 0; n-- {
		cut := string(runes[:n]) + "…"
		if textWidth(cut, px, bold) <= width {
			return cut
		}
	}
	return "…"
}

// duration writes d briefly: 30s, 1m30s, 2h, 250ms.
func duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Microsecond).String()
	}
	s := d.Round(time.Millisecond).String()
	for _, zero := range []struct{ old, new string }{{"m0s", "m"}, {"h0m", "h"}} {
		if strings.HasSuffix(s, zero.old) {
			s = strings.TrimSuffix(s, zero.old) + zero.new
		}
	}
	return s
}

// num writes a coordinate, to a tenth of a pixel.
func num(f float64) string {
	return strconv.FormatFloat(float64(int64(f*10+0.5*sign(f)))/10, 'f', -1, 64)
}

func sign(f float64) float64 {
	if f < 0 {
		return -1
	}
	return 1
}
