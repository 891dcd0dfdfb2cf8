"""Merging gains: `merge` combines two programs' gains since a common base; `merge_every_gain`
folds every gain the run found into the best program, weakest first."""
import random
from dataclasses import dataclass, field

import mutations
from evolve.memo import MERGE, MERGE_DECLINED, Memo
from evolve.operators import Vocabulary, gain_pairs
from evolve.program import Program, admitted, made

MERGE_EVERY_GAIN = "merge_every_gain"


def merge(a: Program, b: Program, base: Program, make, vocabulary: Vocabulary, memo: Memo, rng: random.Random):
    """`a` with the genes `b`'s mutations meant to change since `base`, less those `a`'s
    meant to change (a is the faster: its genes stay); Declined, or Known. Tried once per
    trio."""
    memo.spend(MERGE, (a.id, b.id, base.id))
    genes = intent_since(b, base, memo, vocabulary)
    if genes:
        genes -= intent_since(a, base, memo, vocabulary)
        result = vocabulary.merge(a.source, b.source, base.source, rng, genes) if genes else \
            mutations.Declined("merge_gains", f"{a.id} changed every gene {b.id} meant to change")
    else:  # b's lineage unknown: every gene it differs in
        result = vocabulary.merge(a.source, b.source, base.source, rng)
    if not made(result):
        memo.spend(MERGE_DECLINED, (a.id, b.id))  # nor into a's descendants
    return admitted(result, (a.id, b.id), make, memo, {"base": base.id})


def merge_every_gain(best: Program, scores, make, vocabulary: Vocabulary, memo: Memo, rng: random.Random):
    """One child: `best` with the gains of every correct program that may have beaten its
    own parent (`gains_to_merge`), merged weakest first (`fold_in`). The child is judged
    beside `best`, so gains inside a screen's noise count: the recipe's lead over an
    8-minute search's best was gains of 2-10% each
    (docs/log/2026-11-23-8-minute-search-adjacent-heads-fix.md). `best`'s own gain counts
    too, or a fold over it could undo it (a 2x decode-graphs gain folded over a 5.7x
    prefill-graphs best drew 0.53x of it).
    A program-wide rewrite's gain (every kernel under PDL) is its operator applied again to
    the fold, last. Pair merges combine two gains a generation; a sweep finds many at once.
    Declined when nothing new comes of it, or Known."""
    if vocabulary.merge_gains is None:
        return mutations.Declined(MERGE_EVERY_GAIN, "the operators cannot merge")
    gains = gains_to_merge(scores, memo)
    # A program-wide rewrite touches every gene with a kernel or a matmul, so stronger gains
    # would own its genes and a fold by genes drop it (prefetched_linears, 1.01x, was lost
    # so): it is applied again at the end.
    wide = [g for g in gains if vocabulary.is_program_wide(g[1].operator)]
    by_gene = [g for g in gains if not vocabulary.is_program_wide(g[1].operator)]
    owner = gene_owners(by_gene, vocabulary)
    fold = Fold(best.source)
    for _, program, parent in by_gene:
        fold_in(fold, program, parent, owner, vocabulary, rng)
    for _, program, _ in wide:
        fold.take_if_new(vocabulary.reapply(program, fold.source, rng), program)
    merged = [pid for pid in fold.merged if pid != best.id]
    if not merged or fold.source == best.source:
        return mutations.Declined(MERGE_EVERY_GAIN, f"no gain that {best.id} lacks")
    child = mutations.Applied(fold.source, MERGE_EVERY_GAIN, {"merged": merged})
    return admitted(child, (best.id, merged[-1]), make, memo)


@dataclass
class Fold:
    """merge_every_gain's child as gains are folded into it, and the ids of those it carries."""
    source: str
    merged: list = field(default_factory=list)

    def take(self, source: str, program_id: str, displaced: bool = False) -> None:
        """`source` now, carrying `program_id`'s gain (and, when `displaced`, none before)."""
        self.source, self.merged = source, ([] if displaced else self.merged) + [program_id]

    def take_if_new(self, result, program: Program) -> None:
        """An operator's result, when it applied and changed the fold."""
        if made(result) and result.source != self.source:
            self.take(result.source, program.id)


def fold_in(fold: Fold, program: Program, parent: Program, owner: dict, vocabulary: Vocabulary,
            rng: random.Random) -> None:
    """One gain into the fold, by the genes its operator meant to change (`intended`). A gain
    made on what the fold still is comes whole: nothing was added yet."""
    intended = vocabulary.intended(program, parent)
    is_on_fold = fold.source == parent.source
    if intended is None:  # its operator cannot say: every gene it differs in
        if is_on_fold:
            fold.take(program.source, program.id)
        else:
            merge_genes(fold, program, parent, None, vocabulary, rng)
    elif not intended:  # no gene changed (a constant tuned, as PAGE_SIZE 32): nothing to take
        if is_on_fold:  # by genes; its operator is applied again, with its args
            fold.take(program.source, program.id)
        else:
            fold.take_if_new(vocabulary.replay(program, fold.source), program)
    else:  # only the genes no stronger gain changes: where two changed one, the stronger stays
        owned = {gene for gene in intended if owner[gene] == program.id}
        if is_on_fold and owned == intended:
            fold.take(program.source, program.id)
        elif owned:
            merge_genes(fold, program, parent, owned, vocabulary, rng)


def merge_genes(fold: Fold, program: Program, parent: Program, genes: set | None, vocabulary: Vocabulary,
                rng: random.Random) -> None:
    """`genes` of `program` (None: every one it differs in) merged into the fold. A stronger
    gain whose requirements take back a weaker one's genes displaces it whole (fused_both at
    1.12x was lost to fuse_linears at 1.02x, its merge declined as a copy)."""
    result = vocabulary.merge(fold.source, program.source, parent.source, rng, genes, b_whole=True)
    if made(result):
        fold.take(result.source, program.id, displaced=result.source == program.source)


def gains_to_merge(scores, memo: Memo) -> list:
    """(ratio, program, parent) of every mutant the run bred that may be faster than its
    parent, weakest first: by the fitted speeds, or inside a paired comparison's interval
    (small gains are screened within their parent's noise, some below 1.0x: a search that
    took only clear ones merged none of four,
    docs/log/2026-11-25-search-02fd537-prefetching-kernel.md)."""
    gains = []
    for program in memo.programs.values():
        parent = memo.program(program.parent_ids[0]) if len(program.parent_ids) == 1 else None
        if parent is not None and scores.could_be_a_gain(program.id, parent.id):
            gains.append((scores.gain(program.id, parent.id), program, parent))
    return sorted(gains, key=lambda g: (g[0], g[1].id))


def gene_owners(gains: list, vocabulary: Vocabulary) -> dict:
    """gene -> the id of the gain whose version of it a fold of `gains` ((ratio, program,
    parent), weakest first) takes: the strongest that meant to change it (a weaker gain's
    gene, later overwritten, could still have dragged its requirements along), unless a
    gain made on a program already carrying that version refines it, the strongest such
    (`last_token_logits` made on the best changes the Engine gene that prefill graphs
    owned: by the first rule alone it was never merged)."""
    owner, by_id = {}, {}
    for _, program, parent in gains:
        by_id[program.id] = program
        for gene in vocabulary.intended(program, parent) or ():
            owner[gene] = program.id
    refined = {}
    for _, program, parent in gains:
        for gene in vocabulary.intended(program, parent) or ():
            first = by_id[owner[gene]]
            if first is not program and gene not in vocabulary.differing(parent, first):
                refined[gene] = program.id
    return {**owner, **refined}


def intent_since(program: Program, base: Program, memo: Memo, vocabulary: Vocabulary) -> set:
    """The genes the mutations of `program`'s lineage since `base` meant to change (empty
    when the vocabulary cannot say or the lineage is unknown)."""
    genes = set()
    for mutant, parent in memo.mutations_since(program.id, base.id):
        genes |= (vocabulary.intended(mutant, parent) or set()) if parent is not None else set()
    return genes


def pairs_to_merge(scores, seed: Program, limit: int, vocabulary: Vocabulary, memo: Memo) -> list:
    """(a, b, base) trios whose gains `merge` may combine; none when the vocabulary cannot."""
    if vocabulary.merge_gains is None or limit < 1:
        return []
    return gain_pairs(list(memo.programs.values()), scores, memo, seed, limit)
