package bank

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/onceonly/idempotency/example/internal/input"
	"github.com/onceonly/idempotency/example/internal/reply"
)

// MaxAmount caps one transfer, in cents, far below what a BIGINT holds.
const MaxAmount = 1_000_000_000_00

// A Transfer is what POST /transfers moves.
type Transfer struct {
	ID        string    `json:"id"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Amount    int64     `json:"amount"`
	CreatedAt time.Time `json:"created_at"`
}

// A Receipt is POST /transfers' answer: the transfer and the two balances
// it left.
type Receipt struct {
	Transfer Transfer         `json:"transfer"`
	Balances map[string]int64 `json:"balances"`
}

// errRefused rolls a transfer back after its 4xx answer is written: the
// answer is sent but not stored, and the key is released, so that a
// corrected request with the same key may run.
var errRefused = errors.New("bank: transfer refused")

// Transfer is the sqlidem.TxFunc of POST /transfers: it moves amount from
// one account to another in tx, records the transfer, and answers 201 with
// the receipt. Everything it writes commits with its answer, or not at all.
func (b *Bank) Transfer(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
	var in struct {
		From   string `json:"from"`
		To     string `json:"to"`
		Amount int64  `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		reply.Problem(w, http.StatusBadRequest, "invalid-transfer",
			`body must be a JSON object such as {"from":"alice","to":"bob","amount":2500}`)
		return errRefused
	}
	switch {
	case in.Amount <= 0 || in.Amount > MaxAmount:
		reply.Problem(w, http.StatusUnprocessableEntity, "invalid-amount",
			"amount must be a whole number of cents between 1 and 100000000000")
		return errRefused
	case !input.Text(in.From, 64) || !input.Text(in.To, 64):
		reply.Problem(w, http.StatusUnprocessableEntity, "unknown-account", "from and to must name accounts")
		return errRefused
	case in.From == in.To:
		reply.Problem(w, http.StatusUnprocessableEntity, "same-account", "from and to must be two different accounts")
		return errRefused
	}
	ctx := r.Context()
	// Rows are locked in the order of their ids, so two transfers between
	// the same accounts in opposite directions never deadlock.
	first, second := in.From, in.To
	if second < first {
		first, second = second, first
	}
	for _, id := range []string{first, second} {
		var res sql.Result
		var err error
		if id == in.From {
			res, err = tx.ExecContext(ctx, b.debit,
				in.Amount, id, in.Amount)
		} else {
			res, err = tx.ExecContext(ctx, b.credit, in.Amount, id)
		}
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return b.refuse(tx, w, r, id, id == in.From)
		}
	}
	t := Transfer{ID: newTransferID(), From: in.From, To: in.To, Amount: in.Amount, CreatedAt: time.Now().UTC()}
	if _, err := tx.ExecContext(ctx,
		b.record,
		t.ID, t.From, t.To, t.Amount, t.CreatedAt.UnixMilli()); err != nil {
		return err
	}
	receipt := Receipt{Transfer: t, Balances: map[string]int64{}}
	for _, id := range []string{in.From, in.To} {
		var balance int64
		if err := tx.QueryRowContext(ctx, b.balance, id).Scan(&balance); err != nil {
			return err
		}
		receipt.Balances[id] = balance
	}
	reply.JSON(w, http.StatusCreated, receipt)
	return nil
}

// refuse answers a transfer whose update of account id changed no row:
// the account does not exist or, for the account debited, its balance is
// short.
func (b *Bank) refuse(tx *sql.Tx, w http.ResponseWriter, r *http.Request, id string, debited bool) error {
	var balance int64
	err := tx.QueryRowContext(r.Context(), b.balance, id).Scan(&balance)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		reply.Problem(w, http.StatusUnprocessableEntity, "unknown-account", "there is no account "+quote(id))
	case err != nil:
		return err
	case debited:
		reply.Problem(w, http.StatusUnprocessableEntity, "insufficient-funds",
			"account "+quote(id)+" holds less than the amount")
	default:
		return errors.New("bank: an account's update changed no row, yet it exists")
	}
	return errRefused
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func newTransferID() string {
	var b [12]byte
	rand.Read(b[:])
	return "tr_" + hex.EncodeToString(b[:])
}
