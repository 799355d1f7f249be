package cli

import (
	"fmt"
	"io"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"

	"github.com/sagabox/sagabox/cmd/sagabox/internal/view"
)

// versionOf reads the module version and VCS stamp of the running binary
// from its build info: `go install …@v1.2.3` stamps the version, a build
// in a checkout stamps the commit.
func versionOf(info *debug.BuildInfo, ok bool) view.Version {
	v := view.Version{Version: "(unknown)"}
	if !ok || info == nil {
		return v
	}
	v.GoVersion = info.GoVersion
	if info.Main.Version != "" {
		v.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			if t, err := time.Parse(time.RFC3339, s.Value); err == nil {
				v.Time = t.UTC()
			}
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (a *app) versionCommand() *cobra.Command {
	return withJSON(&cobra.Command{
		Use:   "version",
		Short: "Print the version of this sagabox binary (from its build info)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			v := versionOf(debug.ReadBuildInfo())
			return a.print(v, func(w io.Writer) {
				fmt.Fprintf(w, "sagabox %s (%s)", v.Version, v.GoVersion)
				if v.Revision != "" {
					fmt.Fprintf(w, " commit %s", v.Revision)
					if !v.Time.IsZero() {
						fmt.Fprintf(w, " of %s", v.Time.Format(time.RFC3339))
					}
					if v.Modified {
						fmt.Fprint(w, " (modified)")
					}
				}
				fmt.Fprintln(w)
			})
		},
	})
}
