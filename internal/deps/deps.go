// Package deps pins the modules that packages under construction will
// import, so concurrent work does not race on go.mod. Removed once every
// dependency has a real importer.
package deps

import (
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "golang.org/x/sys/cpu"
	_ "golang.org/x/text/unicode/norm"
)
