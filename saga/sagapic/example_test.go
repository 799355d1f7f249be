package sagapic_test

import (
	"fmt"
	"time"

	"github.com/sagabox/sagabox/saga"
	"github.com/sagabox/sagabox/saga/sagapic"
)

// A definition drawn as Mermaid, for a README or a wiki: the order of the
// steps, each compensation with a dotted arrow back to its step.
func ExampleGraphMermaid() {
	type Transfer struct {
		From, To string
	}
	type Account struct {
		ID string `json:"id"`
	}
	debit := saga.NewCommand[Account, saga.None]("bank.debit")
	undo := saga.NewCommand[Account, saga.None]("bank.refund")
	credit := saga.NewCommand[Account, saga.None]("bank.credit")
	transfer := saga.MustNew("transfer", 1,
		saga.Step("debit", saga.Invoke(debit, func(t *Transfer) Account { return Account{ID: t.From} }, nil),
			saga.Compensate(undo, func(t *Transfer) Account { return Account{ID: t.From} }),
			saga.WithTimeout[Transfer](30*time.Second)),
		saga.Step("credit", saga.Invoke(credit, func(t *Transfer) Account { return Account{ID: t.To} }, nil)),
	)
	fmt.Print(sagapic.GraphMermaid(transfer.Shape(), nil))
	// Output:
	// flowchart TB
	//   start(("transfer v1"))
	//   finish(("end"))
	//   s0("debit<br/>bank.debit<br/>timeout 30s")
	//   c0["bank.refund<br/>compensation of debit"]
	//   s1("credit<br/>bank.credit")
	//   start --> s0
	//   s0 --> s1
	//   s1 --> finish
	//   c0 -. undo .-> s0
	//   classDef compensation fill:#fffbeb,stroke:#b45309
	//   class c0 compensation
}
