"""What an import did: how far it got (the resume point) and what it could not import.

The whole report is committed with each batch as the store's progress note,
so an import resumed after a kill reports the same totals as one that never
stopped; at the end its summary becomes the store's ``import`` metadata.
Lists keep the first few of each kind; the counts are exact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

FIRST = 20  # examples kept of each kind


@dataclass
class ImportReport:
    unit: int = 0  # the source being read, and the position in it after the last row taken
    position: object = 0
    nbytes: int = 0
    imported: int = 0
    bad_rows: int = 0
    first_bad: list[dict] = field(default_factory=list)
    unidentified_rows: int = 0  # rows whose image name could not be read
    first_unidentified: list[dict] = field(default_factory=list)
    outside_dataset: int = 0  # rows of images not in the dataset (ignored)
    duplicates: int = 0  # rows of an image already imported (the first row is kept)
    first_duplicates: list[dict] = field(default_factory=list)
    missing: int = 0  # dataset images no source has
    first_missing: list[int] = field(default_factory=list)

    @classmethod
    def from_note(cls, note: dict | None) -> "ImportReport":
        return cls(**note) if note else cls()

    def to_note(self) -> dict:
        return asdict(self)

    def advance(self, unit: int, position, nbytes: int) -> None:
        self.unit, self.position = unit, position
        self.nbytes += nbytes

    def bad(self, image_id: int, where: str, reason: str) -> None:
        self.bad_rows += 1
        _keep(self.first_bad, {"image": image_id, "where": where, "reason": reason})

    def unidentified(self, where: str, reason: str) -> None:
        self.unidentified_rows += 1
        _keep(self.first_unidentified, {"where": where, "reason": reason})

    def duplicate(self, image_id: int, where: str) -> None:
        self.duplicates += 1
        _keep(self.first_duplicates, {"image": image_id, "where": where})

    def summary(self) -> dict:
        """The store's ``import`` metadata: everything but the resume point."""
        return {k: v for k, v in asdict(self).items() if k not in ("unit", "position")}

    def lines(self) -> list[str]:
        """The report as a person reads it."""
        out = [f"imported {self.imported} images"]
        if self.bad_rows:
            out.append(f"{self.bad_rows} broken rows skipped (recorded in the store's skipped):")
            out += [f"  image {b['image']}: {b['where']}: {b['reason']}" for b in self.first_bad]
        if self.unidentified_rows:
            out.append(f"{self.unidentified_rows} rows name no readable image:")
            out += [f"  {u['where']}: {u['reason']}" for u in self.first_unidentified]
        if self.duplicates:
            shown = ", ".join(f"{d['image']} ({d['where']})" for d in self.first_duplicates[:5])
            out.append(f"{self.duplicates} duplicated images (first row kept; again at {shown})")
        if self.outside_dataset:
            out.append(f"{self.outside_dataset} rows of images not in the dataset (ignored)")
        if self.missing:
            shown = ", ".join(map(str, self.first_missing[:10]))
            out.append(f"{self.missing} dataset images have no features (skipped): {shown}"
                       f"{' ...' if self.missing > 10 else ''}")
        return out


def _keep(examples: list, item) -> None:
    if len(examples) < FIRST:
        examples.append(item)
