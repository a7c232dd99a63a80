// Package report words the admin API's answers, and the journal's timelines,
// for a person at a terminal: what the sidecar's commands print. What a
// broker's header or an app's error says is shown quoted when it is not
// printable, so that it cannot steer the terminal.
package report
